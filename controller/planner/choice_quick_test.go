package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// pruneFixtures are the node kinds of the equivalence test: NVLink meshes,
// NVSwitch boxes, PCIe switch trees, workstations, and a 16-GPU box.
var pruneFixtures = []string{
	"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
	"v100-sxm2-8-aliyun-sccgn6.txt", "p40-pcie-7.txt", "pcie-nvbridge-8.txt",
	"pcie-pex-8.txt", "pcie-plx-10.txt", "pcie-switch-8.txt", "pcie-4.txt",
	"workstation-4-nvbridge.txt", "dgx2-16.txt",
}

// pruneCluster is an in-memory cluster of random nodes with random usage.
// It is its own usageSource: gen counts each node's usage changes.
type pruneCluster struct {
	inv    *Inventory
	slices map[string]*resourceapi.ResourceSlice
	usage  map[string][]allocate.GPUUsage
	gen    map[string]uint64
	log    usageLog
	ip     *Interpreter
	sel    *SelectorEvaluator
}

func (pc *pruneCluster) NodeUsage(n *NodeInventory) []allocate.GPUUsage {
	return slices.Clone(pc.usage[n.Node])
}

func (pc *pruneCluster) Generations(nodes []*NodeInventory, out []uint64) uint64 {
	for i, n := range nodes {
		out[i] = pc.gen[n.Node]
	}
	return pc.log.seq
}

func (pc *pruneCluster) Changes(since uint64, out []string) ([]string, uint64, bool) {
	return pc.log.since(since, out)
}

// setUsage changes a node's usage, as the ledger does when a claim is
// allocated or released.
func (pc *pruneCluster) setUsage(node string, u []allocate.GPUUsage) {
	pc.usage[node] = u
	pc.touch(node)
}

// touch moves a node's generation, as the ledger does when its usage or
// its CPU and memory left change. Pools are named after their nodes.
func (pc *pruneCluster) touch(node string) {
	pc.gen[node]++
	pc.log.add(node)
}

// commit adds a plan's devices to its node's usage.
func (pc *pruneCluster) commit(pl *Plan) {
	u := slices.Clone(pc.usage[pl.Node.Node])
	for _, claim := range pl.Claims {
		for _, r := range claim {
			for _, pos := range r.Positions {
				if r.Share == nil {
					u[pos] = allocate.GPUUsage{Exclusive: true}
					continue
				}
				u[pos].Shares++
				u[pos].MemoryBytes += r.Share.MemoryBytes
				u[pos].Cores += r.Share.Cores
			}
		}
	}
	pc.setUsage(pl.Node.Node, u)
}

// taintFirstDevice republishes a node's slice with a NoSchedule taint on
// its first device, which replaces the node's inventory.
func (pc *pruneCluster) taintFirstDevice(t testing.TB, node string) {
	t.Helper()
	s := pc.slices[node].DeepCopy()
	s.Spec.Devices[0].Taints = append(s.Spec.Devices[0].Taints, resourceapi.DeviceTaint{Key: "example.com/broken", Effect: resourceapi.DeviceTaintEffectNoSchedule})
	if err := pc.inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	pc.slices[node] = s
}

func admitAll(*NodeInventory) bool { return true }

func newPruneCluster(t testing.TB, rng *rand.Rand, nodes int, fixtures []string, busy float64) *pruneCluster {
	t.Helper()
	pc := &pruneCluster{inv: NewInventory(), slices: map[string]*resourceapi.ResourceSlice{}, usage: map[string][]allocate.GPUUsage{}, gen: map[string]uint64{}, sel: NewSelectorEvaluator()}
	classes := map[string]*resourceapi.DeviceClass{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	pc.ip = NewInterpreter(controllertest.ClassLister(classes), pc.sel, pc.inv)
	// Names in an order unrelated to the inventory's, so that the name
	// tie-break is exercised.
	perm := rng.Perm(nodes)
	for i := range nodes {
		topo, err := controllertest.ParseFixture(fixtures[rng.IntN(len(fixtures))])
		if err != nil {
			t.Fatal(err)
		}
		opts := controllertest.SliceOptions{}
		if rng.IntN(8) == 0 {
			// A few nodes with other share defaults, so that default-size
			// shares differ across nodes.
			opts.DefaultShareMemory = 8 << 30
		}
		name := fmt.Sprintf("node-%05d", perm[i])
		s, err := controllertest.Slice(name, topo, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
		pc.slices[name] = s
		u := make([]allocate.GPUUsage, len(topo.GPUs))
		// Some nodes idle: identical idle nodes tie on everything but name.
		if rng.Float64() < busy {
			for g := range u {
				switch x := rng.Float64(); {
				case x < 0.3:
					u[g] = allocate.GPUUsage{Exclusive: true}
				case x < 0.5:
					sh := 1 + rng.IntN(3)
					u[g] = allocate.GPUUsage{Shares: sh, MemoryBytes: int64(sh) * int64(1+rng.IntN(6)) << 30, Cores: int64(sh * (5 + rng.IntN(25)))}
				}
			}
		}
		pc.usage[name] = u
	}
	return pc
}

// randomPod returns the claims of a random pod: whole GPUs with or without
// a required link, shares of fixed or default size, several requests or
// claims, firstAvailable.
func randomPod(rng *rand.Rand) []*resourceapi.ResourceClaim {
	claim := func(name string, reqs []resourceapi.DeviceRequest, cfg ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "d", UID: controllertest.UID(rng.IntN(1 << 30))},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Config: cfg}}}
	}
	sizes := []int64{1, 1, 1, 2, 2, 2, 3, 4, 4, 4, 5, 6, 8, 8}
	switch rng.IntN(10) {
	case 0, 1, 2, 3:
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{controllertest.WholeRequest("g", sizes[rng.IntN(len(sizes))])})}
	case 4, 5:
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2+rng.Int64N(7))},
			controllertest.RequiredNVLinkConfig("g"))}
	case 6:
		mem := []string{"", "2Gi", "8Gi", "20Gi"}[rng.IntN(4)]
		cores := []string{"", "20", "50"}[rng.IntN(3)]
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{controllertest.ShareRequest("s", mem, cores)})}
	case 7:
		return []*resourceapi.ResourceClaim{
			claim("a", []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1+rng.Int64N(4))}),
			claim("b", []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "")}),
		}
	case 8:
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{
			controllertest.WholeRequest("g", 1+rng.Int64N(4)), controllertest.WholeRequest("h", 1+rng.Int64N(2))})}
	default:
		big := controllertest.WholeRequest("x", 8)
		small := controllertest.WholeRequest("y", 2+rng.Int64N(3))
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{{Name: "g", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "big", DeviceClassName: big.Exactly.DeviceClassName, AllocationMode: big.Exactly.AllocationMode, Count: big.Exactly.Count},
			{Name: "small", DeviceClassName: small.Exactly.DeviceClassName, AllocationMode: small.Exactly.AllocationMode, Count: small.Exactly.Count},
		}}})}
	}
}

// TestQuickChoiceMatchesExhaustive checks, over random clusters of mixed
// node kinds, random usage, random pods, random node filters and every
// packing strategy, that the decision taken without planning every node is
// exactly the one planning every admitted node gives: same node, same
// devices, same shares. Each round keeps one score cache over a sequence
// of decisions whose plans are committed, with nodes freed and device
// taints added in between, so that cached scores must follow usage and
// inventory changes.
func TestQuickChoiceMatchesExhaustive(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 5000))
	quick, shortcutShapes, cached, noFit, bounded, indexed := 0, 0, 0, 0, 0, 0
	podHosts := []allocate.Host{{}, {CPUMilli: 2_000, MemoryBytes: 8 << 30}, {CPUMilli: 6_000, MemoryBytes: 24 << 30}}
	for round := range 12 {
		pc := newPruneCluster(t, rng, 40+rng.IntN(80), pruneFixtures, []float64{0.3, 0.7, 1}[round%3])
		cache := newScoreCache()
		// Odd rounds rank by stranded GPU: each node has CPU and memory
		// left (changing as pods are placed), the pods ask for some, and
		// a demand mix of recent shapes weighs the stranding.
		var rank *hostRanking
		var demand *allocate.DemandHistory
		hosts := map[string]*allocate.Host{}
		if round%2 == 1 {
			var err error
			if demand, err = allocate.NewDemandHistory(64, 8); err != nil {
				t.Fatal(err)
			}
			for _, n := range pc.inv.All() {
				hosts[n.Node] = &allocate.Host{CPUMilli: int64(rng.IntN(24_000)), MemoryBytes: int64(rng.IntN(96)) << 30}
			}
		}
		for range 40 {
			nodes := pc.inv.All()
			switch rng.IntN(8) {
			case 0:
				n := nodes[rng.IntN(len(nodes))]
				pc.setUsage(n.Node, make([]allocate.GPUUsage, len(n.Devices)))
			case 1:
				pc.taintFirstDevice(t, nodes[rng.IntN(len(nodes))].Node)
				nodes = pc.inv.All()
			}
			var pending []*Claim
			for _, cl := range randomPod(rng) {
				ic, _, err := pc.ip.Interpret(ctx, cl)
				if err != nil {
					t.Fatalf("interpret: %v", err)
				}
				pending = append(pending, ic)
			}
			pol := allocate.Policy{
				Node: []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
				GPU:  []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
			}
			if demand != nil {
				// Pods without GPUs come and go: CPU and memory change on
				// nodes whose GPU usage does not.
				// A change of a node's CPU or memory left moves its
				// generation, as the controller's ledger.Touch does.
				for range 1 + rng.IntN(len(nodes)/4+1) {
					n := nodes[rng.IntN(len(nodes))]
					hosts[n.Node] = &allocate.Host{CPUMilli: int64(rng.IntN(24_000)), MemoryBytes: int64(rng.IntN(96)) << 30}
					pc.touch(n.Node)
				}
				// Pods of a few sizes, so that scores are kept for each
				// between decisions.
				rank = &hostRanking{left: func(n string) *allocate.Host { return hosts[n] },
					pod: podHosts[rng.IntN(len(podHosts))]}
				pol.Demand = demand.Mix()
			}
			// A pod filter that turns down some nodes, as node fit does
			// (and, ranking by stranding, the nodes short of the pod's CPU
			// or memory, as the fit filter does from the same counts).
			rejected := map[string]bool{}
			var cands []*NodeInventory
			for _, n := range nodes {
				short := rank != nil && (hosts[n.Node].CPUMilli < rank.pod.CPUMilli || hosts[n.Node].MemoryBytes < rank.pod.MemoryBytes)
				if rng.IntN(5) == 0 || short {
					rejected[n.Node] = true
				} else {
					cands = append(cands, n)
				}
			}
			admit := func(n *NodeInventory) bool { return !rejected[n.Node] }
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, cands, pc.NodeUsage, pending)
			ref := choosePlan(plans, pol, rank)
			before := cache.entries()
			// Most decisions over the inventory's list, ranked by each
			// shape's index, the others by its scores kept per node (a
			// decision restricted to some nodes): the index catches up
			// with the changes in between.
			if rng.IntN(4) != 0 {
				cache.inventory(nodes)
				indexed++
			} else {
				cache.inventory(nil)
			}
			got, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admit, pending, rank)
			ok := verdict == quickChosen
			if verdict == quickNoFit {
				noFit++
				if ref != nil {
					t.Fatalf("round %d, policy %+v: the shortcut found nothing fits, planning every node gives %s", round, pol, ref.Summarize())
				}
			}
			single := len(pending) == 1 && len(pending[0].Requests) == 1 && len(pending[0].Requests[0].Alternatives) == 1
			if single && ref != nil {
				shortcutShapes++
			}
			if ok {
				quick++
				if before > 0 {
					cached++
				}
				if ref == nil {
					t.Fatalf("round %d: quick choice %s where planning every node finds none", round, got.plan.Summarize())
				}
				if g, w := got.plan.Summarize(), ref.Summarize(); g != w {
					t.Fatalf("round %d, policy %+v: quick choice %s, planning every node %s", round, pol, g, w)
				}
			}
			if verdict == quickUnsure && rank == nil {
				// Several placements: branch and bound must agree too.
				bp, bv := boundChoice(ctx, pc.sel, pol, nodes, pc, cache, admit, pending)
				switch bv {
				case quickChosen:
					bounded++
					if ref == nil {
						t.Fatalf("round %d: bound choice %s where planning every node finds none", round, bp.Summarize())
					}
					if g, w := bp.Summarize(), ref.Summarize(); g != w {
						t.Fatalf("round %d, policy %+v: bound choice %s, planning every node %s", round, pol, g, w)
					}
				case quickNoFit:
					if ref != nil {
						t.Fatalf("round %d, policy %+v: branch and bound found nothing fits, planning every node gives %s", round, pol, ref.Summarize())
					}
				}
			}
			if ref != nil {
				pc.commit(ref)
				if demand != nil {
					// The pod's CPU and memory are taken on its node, its
					// shape joins the mix, as the controller records it.
					h := hosts[ref.Node.Node]
					h.CPUMilli -= rank.pod.CPUMilli
					h.MemoryBytes -= rank.pod.MemoryBytes
					pc.touch(ref.Node.Node)
					rec := &demandRecorder{hist: demand}
					rec.record(ctx, podAsking(rank.pod), ref)
				}
			}
		}
	}
	t.Logf("%d decisions by the shortcut (%d with scores kept from earlier decisions) out of %d single-placement pods that fit; %d found to fit nowhere; %d pods with several placements by branch and bound; %d decisions over the inventory's list", quick, cached, shortcutShapes, noFit, bounded, indexed)
	// Shares whose default size differs across nodes fall back; most
	// single-placement pods must take the shortcut or it is not tested.
	if shortcutShapes == 0 || quick*10 < shortcutShapes*7 || cached*2 < quick || noFit == 0 || bounded < 20 {
		t.Fatalf("only %d of %d single-placement decisions took the shortcut, %d of them with kept scores, %d found nothing fits; %d by branch and bound", quick, shortcutShapes, cached, noFit, bounded)
	}
}

// TestScoreCacheFollowsUsage checks that a kept score is not used once the
// node's usage generation moved: a node that was best is filled and the
// next decision goes elsewhere, and a freed node is seen free again.
func TestScoreCacheFollowsUsage(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	pc := newPruneCluster(t, rng, 20, []string{"dgx-a100.txt"}, 0)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	cache := newScoreCache()
	nodes := pc.inv.All()
	seen := map[string]bool{}
	for i := range len(nodes) {
		q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil)
		if verdict != quickChosen {
			t.Fatalf("decision %d: shortcut did not apply", i)
		}
		name := q.plan.Node.Node
		if seen[name] {
			t.Fatalf("decision %d: node %s chosen again although it is full", i, name)
		}
		seen[name] = true
		pc.commit(q.plan)
	}
	if _, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil); verdict != quickNoFit {
		t.Fatalf("a full cluster: verdict %d, want nothing fits", verdict)
	}
	freed := nodes[7].Node
	pc.setUsage(freed, make([]allocate.GPUUsage, 8))
	q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil)
	if verdict != quickChosen || q.plan.Node.Node != freed {
		t.Fatalf("after freeing %s: got %v, verdict %d", freed, q, verdict)
	}
	// Generations are the contract: a usage change the cache was not told
	// of leaves the kept score, but planning reads the real usage, so the
	// shortcut gives up rather than return a plan that does not fit.
	pc.usage[freed][0] = allocate.GPUUsage{Exclusive: true}
	if q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil); verdict != quickUnsure {
		t.Fatalf("verdict %d (%v) on %s, whose usage no longer fits: want the shortcut to give up", verdict, q, freed)
	}
}

// TestSampleAlternatives checks the nodes a quick choice names in its
// event: at most three others that fit, in rank order, and the count of
// those not planned adds up with the ones planned and the chosen one.
func TestSampleAlternatives(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	pc := newPruneCluster(t, rng, 30, []string{"dgx1-v100.txt", "pcie-4.txt"}, 0.5)
	nodes := pc.inv.All()
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	admitted := 0
	admit := func(n *NodeInventory) bool {
		admitted++
		return n.Node != nodes[3].Node
	}
	q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, nil, admit, pending, nil)
	if verdict != quickChosen {
		t.Fatal("shortcut did not apply")
	}
	fitting := admitted + q.rest.Len()
	plans, why, unexamined := q.alternatives(ctx, pc.sel, allocate.Policy{}, pc, admit, pending)
	if plans[0] != q.plan || len(plans) != 4 {
		t.Fatalf("want the chosen plan first and three others, got %d plans", len(plans))
	}
	if len(why) != 0 {
		t.Fatalf("nodes ranked as fitting did not fit: %v", why)
	}
	// The alternatives are the next-best nodes: planning every node and
	// ranking without the chosen one gives the first of them.
	var others []*NodeInventory
	for _, n := range nodes {
		if n != q.plan.Node && n.Node != nodes[3].Node {
			others = append(others, n)
		}
	}
	ref, _, _ := exhaustivePlans(ctx, pc.sel, allocate.Policy{}, others, pc.NodeUsage, pending)
	if next := choosePlan(ref, allocate.Policy{}, nil); next == nil || next.Node != plans[1].Node {
		t.Fatalf("first alternative %s, want the next-best node", plans[1].Node.Node)
	}
	for _, pl := range plans[1:] {
		if pl.Node == q.plan.Node || pl.Node.Node == nodes[3].Node {
			t.Fatalf("node %s named as an alternative", pl.Node.Node)
		}
	}
	// Every node that fits was either looked at (admit) or is counted as
	// not planned.
	if unexamined != fitting-admitted || unexamined == 0 {
		t.Fatalf("%d not planned out of %d fitting nodes with %d looked at", unexamined, fitting, admitted)
	}
	note := AlternativesNote(q.plan, plans, why, nil, unexamined)
	if !strings.Contains(note, fmt.Sprintf("%d other nodes not planned", unexamined)) {
		t.Fatalf("note %q does not count the nodes not planned", note)
	}
}

// TestBoundChoiceMatchesExhaustive checks branch and bound alone on many
// pods with several placements (several claims, several requests, shares
// of several GPUs) over small clusters where many nodes tie, so that a
// bound a little off shows as a different node.
func TestBoundChoiceMatchesExhaustive(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(17, 23))
	decided, none := 0, 0
	for round := range 150 {
		pc := newPruneCluster(t, rng, 6+rng.IntN(20), []string{"dgx1-v100.txt", "dgx-a100.txt", "pcie-nvbridge-8.txt", "pcie-4.txt", "dgx2-16.txt"}, []float64{0, 0.5, 1}[round%3])
		cache := newScoreCache()
		for range 30 {
			nodes := pc.inv.All()
			var pending []*Claim
			for {
				pending = pending[:0]
				for _, cl := range randomPod(rng) {
					ic, _, err := pc.ip.Interpret(ctx, cl)
					if err != nil {
						t.Fatalf("interpret: %v", err)
					}
					pending = append(pending, ic)
				}
				if _, v := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, nil, admitAll, pending, nil); v == quickUnsure {
					break
				}
			}
			if rng.IntN(3) == 0 {
				// Shares of two GPUs in one request.
				req := controllertest.ShareRequest("s", "2Gi", "10")
				req.Exactly.Count = 2
				ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "d", UID: controllertest.UID(rng.IntN(1 << 30))},
					Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}})
				if err != nil {
					t.Fatal(err)
				}
				pending = []*Claim{ic}
			}
			pol := allocate.Policy{
				Node: []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
				GPU:  []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
			}
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, nodes, pc.NodeUsage, pending)
			ref := choosePlan(plans, pol, nil)
			// Most decisions with the requests' scores from their shapes'
			// indexes over the inventory's list, the others from the
			// scores kept per node.
			if rng.IntN(4) != 0 {
				cache.inventory(nodes)
			} else {
				cache.inventory(nil)
			}
			got, v := boundChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, pending)
			switch v {
			case quickChosen:
				decided++
				if ref == nil || got.Summarize() != ref.Summarize() {
					want := "none"
					if ref != nil {
						want = ref.Summarize()
					}
					t.Fatalf("round %d, policy %+v: bound choice %s, planning every node %s", round, pol, got.Summarize(), want)
				}
				pc.commit(ref)
			case quickNoFit:
				none++
				if ref != nil {
					t.Fatalf("round %d: branch and bound found nothing fits, planning every node gives %s", round, ref.Summarize())
				}
				// Make room again.
				n := nodes[rng.IntN(len(nodes))]
				pc.setUsage(n.Node, make([]allocate.GPUUsage, len(n.Devices)))
			}
		}
	}
	t.Logf("%d pods with several placements decided by branch and bound, %d found to fit nowhere", decided, none)
	if decided < 300 {
		t.Fatalf("only %d decisions by branch and bound", decided)
	}
}

// podAsking is a pod whose one container requests host's CPU and memory.
func podAsking(host allocate.Host) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(host.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(host.MemoryBytes, resource.BinarySI),
	}}}}}}
}

// TestScoreCacheFollowsHost checks that, ranking by stranded GPU, a kept
// score is not used once the node's CPU or memory left changed, which
// pods without GPUs do without touching its GPU usage: the node that was
// best runs short of CPU, and the next decision goes elsewhere.
func TestScoreCacheFollowsHost(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	pc := newPruneCluster(t, rng, 6, []string{"dgx-a100.txt"}, 0)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	hist, err := allocate.NewDemandHistory(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := hist.Record(allocate.DemandShape{GPUs: 1, Host: allocate.Host{CPUMilli: 1000}}); err != nil {
		t.Fatal(err)
	}
	pol := allocate.Policy{Demand: hist.Mix()}
	hosts := map[string]allocate.Host{}
	for _, n := range pc.inv.All() {
		hosts[n.Node] = allocate.Host{CPUMilli: 64_000, MemoryBytes: 256 << 30}
	}
	rank := &hostRanking{left: func(n string) *allocate.Host { h := hosts[n]; return &h }, pod: allocate.Host{CPUMilli: 2000}}
	cache := newScoreCache()
	nodes := pc.inv.All()
	q, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, pending, rank)
	if verdict != quickChosen {
		t.Fatalf("verdict %d, want a choice", verdict)
	}
	first := q.plan.Node.Node
	hosts[first] = allocate.Host{CPUMilli: 500, MemoryBytes: 256 << 30}
	// A change of a node's CPU or memory left counts in its generation,
	// as the controller's ledger.touch counts it for the fit tracker and
	// the Node handlers (TestHostChangesTouchTheLedger).
	pc.touch(first)
	q, verdict = quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, pending, rank)
	if verdict != quickChosen || q.plan.Node.Node == first {
		t.Fatalf("after %s ran short of CPU: got %v, verdict %d; want another node", first, q, verdict)
	}
}

// TestScoreCacheKeepsUnfitNodesWithDemand: with a demand mix, a node that
// cannot take the shape (too few GPUs free) keeps its entry between
// decisions like one that can; it used to be scored again on every
// decision, a fifth of a 70 %-busy cluster for a 4-GPU pod.
func TestScoreCacheKeepsUnfitNodesWithDemand(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	pc := newPruneCluster(t, rng, 40, []string{"dgx-a100.txt"}, 0.7)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}}}})
	if err != nil {
		t.Fatal(err)
	}
	hist, err := allocate.NewDemandHistory(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := hist.Record(allocate.DemandShape{GPUs: 4}); err != nil {
		t.Fatal(err)
	}
	pol := allocate.Policy{Demand: hist.Mix()}
	nodes := pc.inv.All()
	cache := newScoreCache()
	before := nodesScored.Load()
	if _, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, []*Claim{ic}, nil); verdict == quickUnsure {
		t.Fatal("shortcut did not apply")
	}
	if got := nodesScored.Load() - before; got != int64(len(nodes)) {
		t.Fatalf("first decision scored %d nodes, want all %d", got, len(nodes))
	}
	unfit := 0
	for _, n := range nodes {
		free := 0
		for _, u := range pc.usage[n.Node] {
			if u == (allocate.GPUUsage{}) {
				free++
			}
		}
		if free < 4 {
			unfit++
		}
	}
	if unfit == 0 {
		t.Fatal("the cluster has no node too busy for 4 GPUs: the test checks nothing")
	}
	before = nodesScored.Load()
	if _, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, []*Claim{ic}, nil); verdict == quickUnsure {
		t.Fatal("shortcut did not apply")
	}
	if got := nodesScored.Load() - before; got != 0 {
		t.Fatalf("second decision, nothing changed: scored %d nodes again (%d cannot take 4 GPUs), want 0", got, unfit)
	}
}
