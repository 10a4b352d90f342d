package allocate

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// randomDemand is a mix of a few whole and share shapes with random CPU
// and memory.
func randomDemand(rng *rand.Rand) *DemandMix {
	counts := map[DemandShape]int{}
	for range 1 + rng.IntN(6) {
		s := DemandShape{GPUs: []int{1, 1, 2, 4, 8}[rng.IntN(5)],
			Host: Host{CPUMilli: int64(rng.IntN(32000)), MemoryBytes: int64(rng.IntN(128)) * gib}}
		if s.GPUs == 1 && rng.IntN(2) == 0 {
			s.ShareMilli = 100 + rng.IntN(800)
		}
		counts[s] += 1 + rng.IntN(10)
	}
	m, err := NewDemandMix(counts)
	if err != nil {
		panic(err)
	}
	return m
}

func mustDemand(t testing.TB, counts map[DemandShape]int) *DemandMix {
	t.Helper()
	m, err := NewDemandMix(counts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// strandedCase is one shape of weight 1 on a node with left and host, and
// the GPU it strands there (milli GPU).
type strandedCase struct {
	name  string
	shape DemandShape
	left  []int32
	host  *Host
	want  int64
}

// checkStranded checks each case on a node of the given product.
func checkStranded(t *testing.T, product string, cases []strandedCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := mustDemand(t, map[DemandShape]int{c.shape: 1})
			if got := m.stranded(c.left, c.host, product); got != c.want {
				t.Fatalf("stranded(%v, %+v) = %d, want %d", c.left, c.host, got, c.want)
			}
		})
	}
}

func TestStranded(t *testing.T) {
	// One shape of weight 1 each time, so the result reads in milli GPU.
	small := Host{CPUMilli: 4000, MemoryBytes: 16 * gib}
	cases := []strandedCase{
		{"fits, nothing too small", DemandShape{GPUs: 1, Host: small}, []int32{1000, 1000, 0}, &Host{CPUMilli: 8000, MemoryBytes: 32 * gib}, 0},
		{"host unknown never short", DemandShape{GPUs: 1, Host: Host{CPUMilli: 1 << 40}}, []int32{1000}, nil, 0},
		{"CPU short strands all", DemandShape{GPUs: 1, Host: small}, []int32{1000, 500, 0}, &Host{CPUMilli: 3999, MemoryBytes: 32 * gib}, 1500},
		{"memory short strands all", DemandShape{GPUs: 1, Host: small}, []int32{1000, 1000}, &Host{CPUMilli: 8000, MemoryBytes: gib}, 2000},
		{"too few whole GPUs strands all", DemandShape{GPUs: 2}, []int32{1000, 700, 0}, nil, 1700},
		{"rests smaller than a whole GPU", DemandShape{GPUs: 1}, []int32{1000, 700, 300}, nil, 1000},
		{"share fits the rest", DemandShape{GPUs: 1, ShareMilli: 300}, []int32{700, 300, 200}, nil, 200},
		{"nothing left, nothing stranded", DemandShape{GPUs: 8}, []int32{0, 0}, &Host{}, 0},
	}
	checkStranded(t, "", cases)
}

// TestStrandedHostShort: for a shape pinned to GPU products, the node's
// GPUs beyond what its CPU and memory can feed pods of the shape are
// stranded too; a shape that may run anywhere keeps FGD's one-pod count.
func TestStrandedHostShort(t *testing.T) {
	pinned := func(gpus, share int, cpuCores, memGiB int64) DemandShape {
		return DemandShape{GPUs: gpus, ShareMilli: share, Host: Host{CPUMilli: cpuCores * 1000, MemoryBytes: memGiB * gib}, Products: "P"}
	}
	cores := func(n int64) *Host { return &Host{CPUMilli: n * 1000, MemoryBytes: 1024 * gib} }
	free4 := []int32{1000, 1000, 1000, 1000}
	cases := []strandedCase{
		{"CPU feeds 2 of 4 pods", pinned(1, 0, 12, 1), free4, cores(28), 2000},
		{"may run anywhere: one pod fits, nothing stranded", DemandShape{GPUs: 1, Host: Host{CPUMilli: 12000, MemoryBytes: gib}}, free4, cores(28), 0},
		{"CPU feeds every pod", pinned(1, 0, 12, 1), free4, cores(48), 0},
		{"memory feeds 3 of 4 pods", pinned(1, 0, 1, 32), free4, &Host{CPUMilli: 64000, MemoryBytes: 96 * gib}, 1000},
		{"2-GPU pods: GPUs for 4, CPU for 2", pinned(2, 0, 16, 1), []int32{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}, cores(40), 4000},
		{"shares: GPUs for 5, CPU for 2", pinned(1, 300, 8, 1), []int32{1000, 600}, cores(16), 960},
		{"a fragment too small and the CPU short", pinned(1, 0, 12, 1), []int32{1000, 1000, 1000, 500}, cores(28), 500 + 1000},
		{"host unknown", pinned(1, 0, 12, 1), free4, nil, 0},
	}
	checkStranded(t, "P", cases)
}

// TestChooseNodeFeedsCPUPoorPinnedNodes: a pod that may run anywhere and
// asks for few cores goes to the node of a pinned product whose CPU could
// not feed all of its GPUs to the pinned pods anyway, and leaves the
// node with the CPU for them whole; without pinned pods to come the
// nodes tie and binpack's later criteria decide.
func TestChooseNodeFeedsCPUPoorPinnedNodes(t *testing.T) {
	topo := withProduct(t, v100(t), "V100")
	rich := Host{CPUMilli: 200000, MemoryBytes: 1024 * gib}
	poor := Host{CPUMilli: 66000, MemoryBytes: 1024 * gib}
	nodes := []*NodeState{
		{Name: "a-rich", Topology: topo, Host: &rich},
		{Name: "b-poor", Topology: topo, Host: &poor},
	}
	wide := Host{CPUMilli: 16000, MemoryBytes: 8 * gib}
	for _, c := range []struct {
		name     string
		products string
		want     string
	}{
		{"pinned pods of 16 cores to come", "V100", "b-poor"},
		{"pods of 16 cores that may run anywhere", "", "a-rich"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := mustDemand(t, map[DemandShape]int{{GPUs: 1, Host: wide, Products: c.products}: 1})
			r, err := ChooseNode(nodes, Request{GPUs: 1, Host: Host{CPUMilli: 2000, MemoryBytes: gib}}, Policy{Demand: m})
			if err != nil {
				t.Fatal(err)
			}
			if r.Node != c.want {
				t.Fatalf("chose %s, want %s", r.Node, c.want)
			}
		})
	}
}

func TestNewDemandMixRefusesBadShapes(t *testing.T) {
	for _, c := range []struct {
		counts map[DemandShape]int
		want   string
	}{
		{map[DemandShape]int{}, "no shape"},
		{map[DemandShape]int{{GPUs: 1}: 0}, "no shape"},
		{map[DemandShape]int{{GPUs: 0}: 1}, "gpus must be"},
		{map[DemandShape]int{{GPUs: 2, ShareMilli: 500}: 1}, "a share is of one GPU"},
		{map[DemandShape]int{{GPUs: 1, ShareMilli: 1000}: 1}, "shareMilli must be"},
		{map[DemandShape]int{{GPUs: 1, Host: Host{CPUMilli: -1}}: 1}, "must be >= 0"},
		{map[DemandShape]int{{GPUs: 1}: -1}, "must be >= 0"},
	} {
		if _, err := NewDemandMix(c.counts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewDemandMix(%v) = %v, want an error with %q", c.counts, err, c.want)
		}
	}
}

func TestNewDemandMixKeepsTheMostFrequent(t *testing.T) {
	counts := map[DemandShape]int{}
	for i := range maxDemandShapes + 10 {
		counts[DemandShape{GPUs: 1, Host: Host{CPUMilli: int64(i)}}] = 1 + i
	}
	shapes, weights := mustDemand(t, counts).Shapes()
	if len(shapes) != maxDemandShapes {
		t.Fatalf("kept %d shapes, want %d", len(shapes), maxDemandShapes)
	}
	for i, s := range shapes {
		if s.Host.CPUMilli < 10 || weights[i] != s.Host.CPUMilli+1 {
			t.Fatalf("kept %+v with count %d: one of the 10 least frequent, or a wrong count", s, weights[i])
		}
	}
}

// TestChooseNodeStrandsLeast: two identical 8-GPU nodes, one of them
// short of CPU. On GPUs alone binpack takes the busier node; with the
// demand mix it takes the node where the GPUs left stay usable.
func TestChooseNodeStrandsLeast(t *testing.T) {
	one := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	demand := mustDemand(t, map[DemandShape]int{{GPUs: 1, Host: one}: 3, {GPUs: 2, Host: one}: 1})
	usedTwo := make([]GPUUsage, 8)
	usedTwo[0].Exclusive, usedTwo[1].Exclusive = true, true
	cases := []struct {
		name     string
		busyHost Host // what the busier node has left
		req      Request
		pol      Policy
		want     string
	}{
		{"GPUs alone: binpack", Host{CPUMilli: 9000, MemoryBytes: 512 * gib}, Request{GPUs: 1, Host: one}, Policy{}, "busy"},
		{"demand: the busy node's CPU would run out", Host{CPUMilli: 9000, MemoryBytes: 512 * gib}, Request{GPUs: 1, Host: one}, Policy{Demand: demand}, "idle"},
		{"demand: the busy node keeps CPU for the rest", Host{CPUMilli: 96000, MemoryBytes: 512 * gib}, Request{GPUs: 1, Host: one}, Policy{Demand: demand}, "busy"},
		{"demand, share", Host{CPUMilli: 9000, MemoryBytes: 512 * gib}, Request{Share: &ShareRequest{MemoryBytes: gib, Cores: 10}, Host: one}, Policy{Demand: demand}, "idle"},
		{"demand, spread ignores it", Host{CPUMilli: 9000, MemoryBytes: 512 * gib}, Request{GPUs: 1, Host: one}, Policy{Node: Spread, Demand: demand}, "idle"},
		{"host short is skipped", Host{CPUMilli: 7999, MemoryBytes: 512 * gib}, Request{GPUs: 1, Host: one}, Policy{}, "idle"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nodes := []*NodeState{
				{Name: "busy", Topology: v100(t), Usage: usedTwo, Host: &c.busyHost},
				{Name: "idle", Topology: v100(t), Host: &Host{CPUMilli: 96000, MemoryBytes: 512 * gib}},
			}
			r, err := ChooseNode(nodes, c.req, c.pol)
			if err != nil {
				t.Fatal(err)
			}
			if r.Node != c.want {
				t.Fatalf("chose %s, want %s", r.Node, c.want)
			}
		})
	}
}

// TestChooseNodeLeavesPinnedProductFree: a pod that may run anywhere goes
// to the plentiful product, not to the one pods pinned to it are short of,
// even where the scarce product packs it better.
func TestChooseNodeLeavesPinnedProductFree(t *testing.T) {
	host := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	big := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	m := mustDemand(t, map[DemandShape]int{
		{GPUs: 1, Host: host}:                 4,
		{GPUs: 1, Host: host, Products: "T4"}: 1,
		{GPUs: 1, Host: host, Products: "G2"}: 1,
	})
	t4 := withProduct(t, v100(t), "T4")
	g2 := withProduct(t, v100(t), "G2")
	usedSix := make([]GPUUsage, 8)
	for p := range 6 {
		usedSix[p].Exclusive = true
	}
	nodes := []*NodeState{
		{Name: "a-t4", Topology: t4, Usage: usedSix, Host: &big},
		{Name: "b-g2", Topology: g2, Host: &big},
	}
	// The cluster: the T4 node and three idle G2 nodes, of which b-g2 is
	// one (T4-pinned x13, G2-pinned about x1).
	cluster := append(slices.Clone(nodes), nodeNow(t, 8, big, "G2", 0), nodeNow(t, 8, big, "G2", 0))
	for _, c := range []struct {
		name   string
		demand *DemandMix
		want   string
	}{
		{"by frequency alone", m, "a-t4"},
		{"weighed by scarcity", m.WithScarcity(cluster), "b-g2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ChooseNode(nodes, Request{GPUs: 1, Host: host}, Policy{Demand: c.demand})
			if err != nil {
				t.Fatal(err)
			}
			if r.Node != c.want {
				t.Fatalf("chose %s, want %s", r.Node, c.want)
			}
		})
	}
}

// withProduct is a copy of t whose GPUs are all of the given product.
func withProduct(t testing.TB, topo *topology.Topology, product string) *topology.Topology {
	t.Helper()
	gpus := slices.Clone(topo.GPUs)
	links := make([][]topology.Link, len(gpus))
	for i := range gpus {
		gpus[i].ProductName = product
		links[i] = make([]topology.Link, len(gpus))
		for j := range gpus {
			links[i][j] = topo.Link(i, j)
		}
	}
	out, err := topology.New(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestChooseNodeKeepsScarceNodeFree: a few pods need a node that only one
// node has the CPU and memory for. Counted by frequency alone, a 1-GPU
// pod strands less on that node than on the busier common one (whose last
// pair it would break for the frequent 2-GPU pods); weighed by how few
// nodes can run the big pods, it leaves the big node whole.
func TestChooseNodeKeepsScarceNodeFree(t *testing.T) {
	pod := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	bigPod := Host{CPUMilli: 120000, MemoryBytes: 720 * gib}
	demand := mustDemand(t, map[DemandShape]int{{GPUs: 2, Host: pod}: 10, {GPUs: 8, Host: bigPod}: 1})
	commonHost := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	bigHost := Host{CPUMilli: 128000, MemoryBytes: 768 * gib}
	usedSix := make([]GPUUsage, 8)
	for p := range 6 {
		usedSix[p].Exclusive = true
	}
	nodes := []*NodeState{
		{Name: "a-big", Topology: v100(t), Host: &bigHost},
		{Name: "b-common", Topology: v100(t), Usage: usedSix, Host: &commonHost},
	}
	for _, c := range []struct {
		name   string
		demand *DemandMix
		want   string
	}{
		{"by frequency alone", demand, "a-big"},
		{"weighed by scarcity", demand.WithScarcity(nodes), "b-common"},
	} {
		r, err := ChooseNode(nodes, Request{GPUs: 1, Host: pod}, Policy{Demand: c.demand})
		if err != nil {
			t.Fatal(err)
		}
		if r.Node != c.want {
			t.Errorf("%s: chose %s, want %s", c.name, r.Node, c.want)
		}
	}
}

// TestChooseNodeIdealClassFirst: with the demand mix a 2-GPU request
// still goes where its pair is on the node's best link class, even when
// the node that would break a pair strands less.
func TestChooseNodeIdealClassFirst(t *testing.T) {
	// Only 4-GPU pods to come: the busy node's last two GPUs are of no
	// use to them (taking them strands nothing more, the idle node would
	// strand two), but they are a cross-socket pair.
	demand := mustDemand(t, map[DemandShape]int{{GPUs: 4}: 1})
	// pcie-4: GPUs 0-1 and 2-3 on two PCIe switches on two sockets.
	u := make([]GPUUsage, 4)
	u[1].Exclusive, u[3].Exclusive = true, true
	nodes := []*NodeState{
		{Name: "a-broken-pair", Topology: pcie4(t), Usage: u},
		{Name: "b-idle", Topology: pcie4(t)},
	}
	r, err := ChooseNode(nodes, Request{GPUs: 2}, Policy{Demand: demand})
	if err != nil {
		t.Fatal(err)
	}
	if r.Node != "b-idle" || r.WeakestLink != idealKey(pcie4(t), 2).link() {
		t.Fatalf("chose %s with weakest link %s, want b-idle on %s", r.Node, r.WeakestLink, idealKey(pcie4(t), 2).link())
	}
}

func TestChooseNodeAllHostShort(t *testing.T) {
	nodes := []*NodeState{{Name: "n", Topology: v100(t), Host: &Host{CPUMilli: 1000}}}
	for _, req := range []Request{{GPUs: 1, Host: Host{CPUMilli: 2000}}, {Share: &ShareRequest{MemoryBytes: gib, Cores: 10}, Host: Host{CPUMilli: 2000}}} {
		_, err := ChooseNode(nodes, req, Policy{})
		var u *UnsatisfiableError
		if !errors.As(err, &u) {
			t.Fatalf("request %+v: got %v, want UnsatisfiableError", req, err)
		}
	}
	if _, err := ChooseNode(nodes, Request{GPUs: 1, Host: Host{MemoryBytes: -1}}, Policy{}); err == nil || errors.As(err, new(*UnsatisfiableError)) {
		t.Fatalf("negative request host: got %v, want a validation error", err)
	}
}

func TestChooseHost(t *testing.T) {
	whole := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	demand := mustDemand(t, map[DemandShape]int{{GPUs: 1, Host: whole}: 1})
	big := Host{CPUMilli: 64000, MemoryBytes: 256 * gib}
	tight := Host{CPUMilli: 10000, MemoryBytes: 256 * gib}
	full := make([]GPUUsage, 8)
	for p := range full {
		full[p].Exclusive = true
	}
	pod := Host{CPUMilli: 4000, MemoryBytes: 8 * gib}
	cases := []struct {
		name  string
		nodes []*NodeState
		pol   Policy
		want  string
	}{
		{"a node without GPUs first", []*NodeState{{Name: "gpu", Topology: v100(t), Host: &big}, {Name: "plain", Host: &big}}, Policy{Demand: demand}, "plain"},
		{"a GPU node with no GPU left before an idle one", []*NodeState{{Name: "a-idle", Topology: v100(t), Host: &big}, {Name: "b-full", Topology: v100(t), Usage: full, Host: &big}}, Policy{Demand: demand}, "b-full"},
		{"not where its CPU would strand GPUs", []*NodeState{{Name: "a-tight", Topology: v100(t), Host: &tight}, {Name: "b-big", Topology: v100(t), Host: &big}}, Policy{Demand: demand}, "b-big"},
		{"without demand: packs", []*NodeState{{Name: "a-big", Topology: v100(t), Host: &big}, {Name: "b-tight", Topology: v100(t), Host: &tight}}, Policy{}, "b-tight"},
		{"skips nodes it does not fit", []*NodeState{{Name: "a", Host: &Host{CPUMilli: 3000, MemoryBytes: 256 * gib}}, {Name: "b", Topology: v100(t), Host: &big}}, Policy{Demand: demand}, "b"},
		{"equal nodes: by name", []*NodeState{{Name: "b", Topology: v100(t), Host: &big}, {Name: "a", Topology: v100(t), Host: &big}}, Policy{Demand: demand}, "a"},
		{"equal nodes: by tie key before name", []*NodeState{
			{Name: "a", TieKey: TopologyTieKey([]string{"leaf-2"}, "a"), Topology: v100(t), Host: &big},
			{Name: "b", TieKey: TopologyTieKey([]string{"leaf-1"}, "b"), Topology: v100(t), Host: &big},
		}, Policy{Demand: demand}, "b"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ChooseHost(c.nodes, pod, c.pol)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("chose %s, want %s", got, c.want)
			}
		})
	}
	if _, err := ChooseHost([]*NodeState{{Name: "a", Host: &Host{}}}, pod, Policy{}); !errors.As(err, new(*UnsatisfiableError)) {
		t.Fatalf("no node fits: got %v, want UnsatisfiableError", err)
	}
	if _, err := ChooseHost([]*NodeState{{Name: "a"}}, pod, Policy{}); err == nil || !strings.Contains(err.Error(), "host is not set") {
		t.Fatalf("node without host: got %v", err)
	}
}

// TestHoldMixes: a snapshot within MixHoldDistance of the mix in use
// keeps it (the same pointer, so kept scores stay valid); one that moved
// further, or weighs other shapes, replaces it.
func TestHoldMixes(t *testing.T) {
	a, b := DemandShape{GPUs: 1}, DemandShape{GPUs: 2}
	held := mustDemand(t, map[DemandShape]int{a: 100, b: 100})
	near := mustDemand(t, map[DemandShape]int{a: 104, b: 96}) // L1 0.04
	far := mustDemand(t, map[DemandShape]int{a: 120, b: 80})  // L1 0.2
	other := mustDemand(t, map[DemandShape]int{a: 100, {GPUs: 4}: 100})
	for _, c := range []struct {
		name       string
		held, next *DemandMix
		want       *DemandMix
	}{
		{"near", held, near, held},
		{"far", held, far, far},
		{"other shapes", held, other, other},
		{"nothing held", nil, near, near},
	} {
		if got := HoldDemand(c.held, c.next); got != c.want {
			t.Errorf("HoldDemand %s: got %p, want %p", c.name, got, c.want)
		}
	}
	// Scarcity counts in the distance: the same counts weighed apart.
	anyHost := Host{CPUMilli: math.MaxInt64, MemoryBytes: math.MaxInt64}
	caps := []*NodeState{nodeNow(t, 1, anyHost, "", 0), nodeNow(t, 1, anyHost, "", 0), nodeNow(t, 1, anyHost, "", 0), nodeNow(t, 2, anyHost, "", 0)}
	if got := HoldDemand(held.WithScarcity(nil), held.WithScarcity(caps)); got == nil || got.scarcity[1] != 40 {
		t.Errorf("HoldDemand kept a mix whose weights moved by scarcity: %+v", got)
	}
	sHeld := mustSizeMix(map[int]float64{1: 50, 2: 50})
	sNear := mustSizeMix(map[int]float64{1: 52, 2: 48})
	sFar := mustSizeMix(map[int]float64{1: 60, 2: 40})
	if HoldSize(sHeld, sNear) != sHeld || HoldSize(sHeld, sFar) != sFar || HoldSize(nil, sNear) != sNear {
		t.Error("HoldSize: want the held mix for a near one only")
	}
}
