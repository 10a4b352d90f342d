package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/driver/topology"
)

// positionsMask turns positions into a set.
func positionsMask(pos ...int) uint64 {
	var m uint64
	for _, p := range pos {
		m |= 1 << p
	}
	return m
}

func TestStrandedGPUs(t *testing.T) {
	// pcie-nvbridge-8: NV4 pairs 0-1, 2-3, 4-5, 6-7; 0-3 under one PCIe
	// switch tree (PXB), 4-7 across host bridges (NODE), SYS between.
	nvbridge := fixtureTopology(t, "pcie-nvbridge-8.txt")
	dgx1 := fixtureTopology(t, "dgx1-v100.txt")
	for _, tc := range []struct {
		name string
		topo *topology.Topology
		free []int
		k    int
		want int
	}{
		{"idle node has no stranded GPU (pairs)", nvbridge, []int{0, 1, 2, 3, 4, 5, 6, 7}, 2, 0},
		{"idle node has no stranded GPU (quads), though 4-7 only reach NODE", nvbridge, []int{0, 1, 2, 3, 4, 5, 6, 7}, 4, 0},
		{"one GPU of two NVLink pairs taken strands the partners", nvbridge, []int{1, 3, 4, 5, 6, 7}, 2, 2},
		{"quad 0-3 broken: 1 and 3 lose their PXB quad, 4-7 keep their NODE quad", nvbridge, []int{1, 3, 4, 5, 6, 7}, 4, 2},
		{"quad 4-7 broken: 5, 6, 7 stranded", nvbridge, []int{0, 1, 2, 3, 5, 6, 7}, 4, 3},
		{"partner of 4 stranded for pairs", nvbridge, []int{0, 1, 2, 3, 5, 6, 7}, 2, 1},
		{"nothing free, nothing stranded", nvbridge, nil, 2, 0},
		{"DGX-1 idle quads", dgx1, []int{0, 1, 2, 3, 4, 5, 6, 7}, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &planner.NodeInventory{Node: "n", Topo: tc.topo}
			got, ok := planner.StrandedGPUs(tc.topo, positionsMask(tc.free...), tc.k, n.IdleBest(tc.k))
			if !ok {
				t.Fatal("search ran over its budget")
			}
			if got != tc.want {
				t.Errorf("stranded GPUs for k=%d with free %v: got %d, want %d", tc.k, tc.free, got, tc.want)
			}
		})
	}
}

// TestStrandedGPUsMatchesEnumeration checks the clique search against
// brute force on every free set of an 8-GPU DGX-1 (hybrid cube mesh, where
// "linked at >= c" is not transitive).
func TestStrandedGPUsMatchesEnumeration(t *testing.T) {
	topo := fixtureTopology(t, "dgx1-v100.txt")
	n := &planner.NodeInventory{Node: "n", Topo: topo}
	const all = 1<<8 - 1
	for _, k := range []int{2, 4} {
		idle := n.IdleBest(k)
		for free := uint64(0); free <= all; free++ {
			want := 0
			for p := range 8 {
				if free&(1<<p) != 0 && !inGoodSet(topo, free, k, p, idle[p]) {
					want++
				}
			}
			got, ok := planner.StrandedGPUs(topo, free, k, idle)
			if !ok || got != want {
				t.Fatalf("k=%d free=%08b: got %d (ok %v), enumeration says %d", k, free, got, ok, want)
			}
		}
	}
}

// inGoodSet enumerates the k-subsets of free containing p.
func inGoodSet(t *topology.Topology, free uint64, k, p int, c topology.Link) bool {
	for s := free; s != 0; s = (s - 1) & free {
		if s&(1<<p) == 0 || popcount(s) != k {
			continue
		}
		good := true
		for i := range 8 {
			for j := i + 1; j < 8; j++ {
				if s&(1<<i) != 0 && s&(1<<j) != 0 && t.Link(i, j) < c {
					good = false
				}
			}
		}
		if good {
			return true
		}
	}
	return false
}

func popcount(s uint64) int {
	n := 0
	for ; s != 0; s &= s - 1 {
		n++
	}
	return n
}

func TestBestLink(t *testing.T) {
	n := &planner.NodeInventory{Node: "n", Topo: fixtureTopology(t, "pcie-nvbridge-8.txt")}
	for k, want := range map[int]topology.Link{2: topology.NVLink(4), 4: topology.LinkPXB, 8: topology.LinkSYS} {
		if got, ok := n.BestLink(k); !ok || got != want {
			t.Errorf("bestLink(%d) = %s, %v; want %s", k, got, ok, want)
		}
	}
	if _, ok := n.BestLink(1); ok {
		t.Error("bestLink(1) answered; one GPU has no link")
	}
}

// TestInventoryCollector scrapes the per-node gauges from an inventory
// built from a published slice and a ledger fed with claims, as the
// informers feed them.
func TestInventoryCollector(t *testing.T) {
	topo := fixtureTopology(t, "pcie-nvbridge-8.txt")
	for i := range topo.GPUs {
		topo.GPUs[i].ProductName = "Tesla T4"
	}
	slice, err := controllertest.Slice("n", topo, controllertest.SliceOptions{MemoryBytes: 16 << 30})
	if err != nil {
		t.Fatal(err)
	}
	// gpu-7 is tainted (as the health checker of the kubelet plugin does).
	for i := range slice.Spec.Devices {
		if slice.Spec.Devices[i].Name == "gpu-7" {
			slice.Spec.Devices[i].Taints = append(slice.Spec.Devices[i].Taints,
				resourceapi.DeviceTaint{Key: "gpu.gpulink.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
	}
	inv := planner.NewInventory()
	if err := inv.Upsert(slice); err != nil {
		t.Fatal(err)
	}
	l := planner.NewLedger()
	l.Observe(controllertest.ClaimWith("a", "1", controllertest.WholeResult("gpu-0"), controllertest.WholeResult("gpu-2")))
	l.Observe(controllertest.ClaimWith("b", "2", controllertest.ShareResult("gpu-4", "2Gi", "20")))
	l.Observe(controllertest.ClaimWith("c", "3", controllertest.ShareResult("gpu-4", "4Gi", "30")))

	m := NewMetrics(nil)
	m.inventory.setSource(inv, l)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.inventory)

	// Free: 1, 3, 5, 6. Pairs: 1, 3 and 5 lost their NV4 partner (6's is
	// tainted, so 6 is stranded too). Quads: 1, 3 lost their PXB quad; 5
	// and 6 their NODE quad (4 shared, 7 tainted).
	want := `
# HELP gpulink_controller_fragmented_gpus Per node and set size k (2, 4, 8, ... below the node's GPU count): free GPUs that belong to no set of k free GPUs whose every pair is linked at the best class a k-set containing that GPU has on the idle node. 0 on an idle node; each stranded GPU lost its best k-set to allocations.
# TYPE gpulink_controller_fragmented_gpus gauge
gpulink_controller_fragmented_gpus{node="n",size="2"} 4
gpulink_controller_fragmented_gpus{node="n",size="4"} 4
# HELP gpulink_controller_gpu_memory_bytes GPU memory published, per node and product.
# TYPE gpulink_controller_gpu_memory_bytes gauge
gpulink_controller_gpu_memory_bytes{node="n",product="Tesla T4"} 1.37438953472e+11
# HELP gpulink_controller_gpus GPUs per node, product and state: allocated (given out whole), shared (holds at least one share), free (neither, and no NoSchedule/NoExecute device taint besides gpulink's managed one), tainted (neither, but such a taint keeps requests without a toleration away).
# TYPE gpulink_controller_gpus gauge
gpulink_controller_gpus{node="n",product="Tesla T4",state="allocated"} 2
gpulink_controller_gpus{node="n",product="Tesla T4",state="free"} 4
gpulink_controller_gpus{node="n",product="Tesla T4",state="shared"} 1
gpulink_controller_gpus{node="n",product="Tesla T4",state="tainted"} 1
# HELP gpulink_controller_share_memory_bytes GPU memory allocated to shares, per node and product.
# TYPE gpulink_controller_share_memory_bytes gauge
gpulink_controller_share_memory_bytes{node="n",product="Tesla T4"} 6.442450944e+09
# HELP gpulink_controller_shares Shares of one GPU allocated, per node and product.
# TYPE gpulink_controller_shares gauge
gpulink_controller_shares{node="n",product="Tesla T4"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}

	// Releasing the whole GPUs heals the pairs and quad 0-3; the cached
	// figure must follow the ledger.
	l.Forget("a")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpulink_controller_fragmented_gpus Per node and set size k (2, 4, 8, ... below the node's GPU count): free GPUs that belong to no set of k free GPUs whose every pair is linked at the best class a k-set containing that GPU has on the idle node. 0 on an idle node; each stranded GPU lost its best k-set to allocations.
# TYPE gpulink_controller_fragmented_gpus gauge
gpulink_controller_fragmented_gpus{node="n",size="2"} 2
gpulink_controller_fragmented_gpus{node="n",size="4"} 2
`), "gpulink_controller_fragmented_gpus"); err != nil {
		t.Fatal(err)
	}

	// The node's slice goes: its series go too.
	inv.Remove(slice)
	if n := testutil.CollectAndCount(m.inventory); n != 0 {
		t.Errorf("%d series after the node's slices were removed, want 0", n)
	}
}

func TestInventoryCollectorWithoutSource(t *testing.T) {
	if n := testutil.CollectAndCount(NewMetrics(nil).inventory); n != 0 {
		t.Errorf("a collector without a controller reported %d series", n)
	}
}

// TestDecisionMetrics runs decisions through the controller and checks the
// outcome counter, the gate wait histogram and the below-best counter.
func TestDecisionMetrics(t *testing.T) {
	// Another allocator holds one GPU of every NV4 pair of the node, so a
	// pair request can get PXB at best (1 and 3), below the node's NV4.
	held := controllertest.ClaimWith("held-uid", "1", controllertest.WholeResult("gpu-0"), controllertest.WholeResult("gpu-2"), controllertest.WholeResult("gpu-4"), controllertest.WholeResult("gpu-6"))
	held.Name, held.Namespace = "held", ns
	for i := range held.Status.Allocation.Devices.Results {
		held.Status.Allocation.Devices.Results[i].Pool = "nb"
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	// The ranking counts are the process's: compare with what they were.
	rankingBefore := planner.Ranking()
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, Metrics: m},
		objs(classes(), gpuNode(t, "nb", "pcie-nvbridge-8.txt"), []runtime.Object{held})...).start()
	h.claim("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	h.pod("p", true, "pair")
	h.waitAllocated("pair")
	h.waitUngated("p")
	h.claim("eight", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 8)}})
	h.pod("big", true, "eight")
	h.waitEvent(ns+"/big", report.ReasonWaiting)

	if got := testutil.ToFloat64(m.Decisions.WithLabelValues(OutcomeAllocated)); got != 1 {
		t.Errorf("allocated decisions = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues(OutcomeWaiting)); got < 1 {
		t.Errorf("waiting decisions = %v, want at least 1", got)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues(OutcomeError)); got != 0 {
		t.Errorf("error decisions = %v, want 0", got)
	}
	if got := testutil.CollectAndCount(m.GateWait); got != 1 {
		t.Fatalf("gate wait histogram has %d series", got)
	}
	// Every series of the node's kind exists (at 0 until counted); the
	// pair counts in one.
	var counted []string
	for _, l := range seriesLabels(t, m.BelowBestLink) {
		if strings.HasSuffix(l, "/(nonzero)") {
			counted = append(counted, l)
		}
	}
	if got := testutil.ToFloat64(m.BelowBestLink.WithLabelValues("2", "PXB")); got != 1 || len(counted) != 1 {
		t.Errorf("below_best_link_total{size=2,weakest_link=PXB} = %v, counted series %v; want 1 in that series alone", got, counted)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var observed uint64
	for _, f := range families {
		if f.GetName() == "gpulink_controller_gate_wait_seconds" {
			observed = f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if observed != 1 {
		t.Errorf("gate wait observations = %d, want 1 (one pod ungated)", observed)
	}
	// The first decision of each request shape ranks the node afresh: one
	// node score at least, and the shape's ranking built for the node
	// list.
	var scores, builtForNodes float64
	for _, f := range families {
		switch f.GetName() {
		case "gpulink_controller_node_scores_total":
			scores = f.GetMetric()[0].GetCounter().GetValue()
		case "gpulink_controller_ranking_syncs_total":
			for _, mt := range f.GetMetric() {
				if mt.GetLabel()[0].GetValue() == "nodes" {
					builtForNodes = mt.GetCounter().GetValue()
				}
			}
		}
	}
	if scores < float64(rankingBefore.NodesScored+1) || builtForNodes < float64(rankingBefore.Builds["nodes"]+1) {
		t.Errorf("node scores %v (before %d), rankings built for the node list %v (before %d): want both up", scores, rankingBefore.NodesScored, builtForNodes, rankingBefore.Builds["nodes"])
	}
}

// TestAllocatedEventNamesAlternatives checks that the allocation event
// names the nodes that also fit, for `gpulink explain`.
func TestAllocatedEventNamesAlternatives(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "nb", "pcie-nvbridge-8.txt"), gpuNode(t, "p40", "p40-pcie-7.txt"))...).start()
	h.claim("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	h.pod("p", true, "pair")
	c := h.waitAllocated("pair")
	chosen, other := allocatedNode(c), "p40"
	if chosen == "p40" {
		other = "nb"
	}
	e := h.waitEvent(ns+"/p", report.ReasonAllocated)
	if !contains(e.Note, "on "+chosen+"; also fit: "+other+" (2 GPUs weakest link ") {
		t.Errorf("event note %q does not name %s as an alternative", e.Note, other)
	}
}

// TestGangsPlacedSeriesExistFromStart checks that gangs_placed_total has a
// series at 0 for every level of the configured hierarchy before any gang
// is placed, so that Prometheus sees the first placement as an increase.
func TestGangsPlacedSeriesExistFromStart(t *testing.T) {
	hierarchy, err := gang.NewHierarchy([]gang.Level{{Key: "example.com/leaf"}, {Key: "example.com/spine", Name: "pod"}})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	newHarnessWith(t, Config{Workers: 1, Metrics: m, Gangs: GangConfig{Hierarchy: hierarchy}}, objs(classes())...).start()
	want := []string{"node", "leaf", "pod", "cluster"}
	if n := testutil.CollectAndCount(m.GangsPlaced); n != len(want) {
		t.Errorf("gangs_placed_total has %d series, want %d (%v)", n, len(want), want)
	}
	for _, level := range want {
		if got := testutil.ToFloat64(m.GangsPlaced.WithLabelValues(level)); got != 0 {
			t.Errorf("gangs_placed_total{level=%q} = %v before any gang, want 0", level, got)
		}
	}
}

// TestFixedSeriesExistFromStart checks that every decision outcome, error
// reason and release reason has its series at 0 before anything happens.
func TestFixedSeriesExistFromStart(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	for _, c := range []struct {
		name string
		vec  *prometheus.CounterVec
		want []string
	}{
		{"decisions_total", m.Decisions, []string{OutcomeAllocated, OutcomeWaiting, OutcomeInvalid, OutcomeNotReady, OutcomeError, OutcomeHostPlaced}},
		{"errors_total", m.Errors, []string{errReasonConflict, errReasonAPI, errReasonUninterpretable, errReasonUnsatisfiable, errReasonInventory, errReasonBoundElsewhere}},
		{"released_allocations_total", m.Released, []string{releaseReasonRollback, releaseReasonGangRollback, releaseReasonOrphaned, releaseReasonUnschedulable, releaseReasonScheduler}},
	} {
		if n := testutil.CollectAndCount(c.vec); n != len(c.want) {
			t.Errorf("%s: %d series, want %d (%v)", c.name, n, len(c.want), c.want)
		}
		for _, v := range c.want {
			if got := testutil.ToFloat64(c.vec.WithLabelValues(v)); got != 0 {
				t.Errorf("%s{%s} = %v before anything happened, want 0", c.name, v, got)
			}
		}
	}
}
