package allocate

import (
	"slices"
	"testing"
)

// TestOverdemanded: a product is over-demanded when the pods pinned to it
// ask for a larger share of the mix's GPU than its share of the
// unallocated GPU, counting each shape's GPUs and what it needs of each,
// and a shape pinned to several products evenly for each that has GPU
// left.
func TestOverdemanded(t *testing.T) {
	host := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	big := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	anywhere := DemandShape{GPUs: 1, Host: host}
	t4 := DemandShape{GPUs: 1, Host: host, Products: "T4"}
	t4Pair := DemandShape{GPUs: 2, Host: host, Products: "T4"}
	t4Share := DemandShape{GPUs: 1, ShareMilli: 500, Host: host, Products: "T4"}
	g2OrT4 := DemandShape{GPUs: 1, Host: host, Products: ProductsKey([]string{"G2", "T4"})}
	// 3 G2 nodes of 8 GPUs and 2 T4 nodes of 2 (t4GivenOut of each given
	// out): T4 is 4 of 28 GPUs, 1/7, when idle.
	cluster := func(t4GivenOut int) []*NodeState {
		return []*NodeState{nodeNow(t, 8, big, "G2", 0), nodeNow(t, 8, big, "G2", 0), nodeNow(t, 8, big, "G2", 0),
			nodeNow(t, 2, big, "T4", t4GivenOut), nodeNow(t, 2, big, "T4", t4GivenOut)}
	}
	cases := []struct {
		name   string
		counts map[DemandShape]int
		nodes  []*NodeState
		want   []string
	}{
		{"pinned 1/4 of the demand, 1/7 of the supply", map[DemandShape]int{anywhere: 3, t4: 1}, cluster(0), []string{"T4"}},
		{"pinned 1/7, as much as it has: not over", map[DemandShape]int{anywhere: 6, t4: 1}, cluster(0), nil},
		{"pinned 1/11", map[DemandShape]int{anywhere: 10, t4: 1}, cluster(0), nil},
		{"GPUs counted: one 2-GPU pod of 8 GPUs asked", map[DemandShape]int{anywhere: 6, t4Pair: 1}, cluster(0), []string{"T4"}},
		{"shares counted by what they take: 1/13", map[DemandShape]int{anywhere: 6, t4Share: 1}, cluster(0), nil},
		{"half of T4's GPUs given out: 1/7 asked, 2 of 26 left", map[DemandShape]int{anywhere: 6, t4: 1}, cluster(1), []string{"T4"}},
		{"pinned to G2 or T4, 1 of 4: half of it for T4, 1/8", map[DemandShape]int{anywhere: 3, g2OrT4: 1}, cluster(0), nil},
		{"pinned to G2 or T4: half of 2 of 4 for each", map[DemandShape]int{anywhere: 2, g2OrT4: 2}, cluster(0), []string{"T4"}},
		{"pinned to G2 or T4 with no T4 left: all for G2, which has all", map[DemandShape]int{anywhere: 2, g2OrT4: 2}, cluster(2), nil},
		{"nothing pinned", map[DemandShape]int{anywhere: 1}, cluster(0), nil},
		{"no nodes", map[DemandShape]int{t4: 1}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := mustDemand(t, c.counts).WithScarcity(c.nodes)
			if got := w.Overdemanded(); !slices.Equal(got, c.want) {
				t.Errorf("Overdemanded = %v, want %v", got, c.want)
			}
		})
	}
	if got := (*DemandMix)(nil).Overdemanded(); got != nil {
		t.Errorf("nil mix: Overdemanded = %v, want none", got)
	}
	if got := mustDemand(t, map[DemandShape]int{t4: 1}).Overdemanded(); len(got) != 0 {
		t.Errorf("a mix not weighed by WithScarcity: Overdemanded = %v, want none", got)
	}
}

// overdemandCluster is the case of FGD's gpuspec33 list in small: a G2
// node of 8 idle GPUs and 96 cores, and a T4 node of 2 GPUs and 96 cores
// whose first GPU holds a share of 530 milli GPU, which a share of 470
// fills. The mix: 2 shares of 470 pinned to T4, 2 whole GPUs and 1 whole
// GPU with 90 cores that may run anywhere. T4 is 1,470 of 9,470 milli
// GPU left (16 %) and asked for 940 of 3,940 (24 %).
func overdemandCluster(t *testing.T) (g2, t4 *NodeState, w *DemandMix) {
	t.Helper()
	pix := func(i, j int) string { return "PIX" }
	host := func() *Host { return &Host{CPUMilli: 96000, MemoryBytes: 1 << 40} }
	g2 = &NodeState{Name: "g2", Topology: withProduct(t, generated(t, 8, 16, pix), "G2"), Usage: make([]GPUUsage, 8), Host: host()}
	t4 = &NodeState{Name: "t4", Topology: withProduct(t, generated(t, 2, 16, pix), "T4"), Usage: make([]GPUUsage, 2), Host: host()}
	t4.Usage[0] = GPUUsage{Shares: 1, Cores: 53, MemoryBytes: 1 << 20}
	m := mustDemand(t, map[DemandShape]int{
		{GPUs: 1, ShareMilli: 470, Products: "T4"}: 2,
		{GPUs: 1}:                              2,
		{GPUs: 1, Host: Host{CPUMilli: 90000}}: 1,
	})
	return g2, t4, m.WithScarcity([]*NodeState{g2, t4})
}

// TestChooseNodeKeepsOthersOffOverdemandedProduct: a share that may run
// anywhere packs best onto the T4 GPU a T4 share started (it fills it,
// and on the G2 node it would leave a fragment and the cores the 90-core
// pods need), and the scarcity weighing alone lets it; with T4
// over-demanded it goes to the G2 node. A share pinned to T4 still takes
// the T4 node that packs it best.
func TestChooseNodeKeepsOthersOffOverdemandedProduct(t *testing.T) {
	g2, t4, w := overdemandCluster(t)
	if got := w.Overdemanded(); !slices.Equal(got, []string{"T4"}) {
		t.Fatalf("Overdemanded = %v, want [T4]", got)
	}
	anywhere := Request{Share: &ShareRequest{Cores: 47, MemoryBytes: 1 << 20}, Host: Host{CPUMilli: 8000}}
	pol := Policy{Node: Binpack, GPU: Binpack, Demand: w}
	r, err := ChooseNode([]*NodeState{g2, t4}, anywhere, pol)
	if err != nil {
		t.Fatal(err)
	}
	if r.Node != "g2" {
		t.Errorf("a share that may run anywhere went to %s, want g2: T4's GPU is wanted by the pods pinned to it", r.Node)
	}
	// What the scarcity weighing alone would do: the reason for the rule.
	plain := withoutOverdemand(w)
	pol.Demand = plain
	if r, err := ChooseNode([]*NodeState{g2, t4}, anywhere, pol); err != nil || r.Node != "t4" {
		t.Errorf("without the over-demand cost: %v, %v; want t4 (the case no longer shows the rule)", r.Node, err)
	}

	// Pinned to T4 (a pod's selector leaves ChooseNode the T4 nodes
	// only): the started GPU packs best, with the cost or without.
	idleT4 := &NodeState{Name: "t4-idle", Topology: t4.Topology, Usage: make([]GPUUsage, 2), Host: &Host{CPUMilli: 96000, MemoryBytes: 1 << 40}}
	for _, d := range []*DemandMix{w, plain} {
		pol.Demand = d
		r, err := ChooseNode([]*NodeState{idleT4, t4}, anywhere, pol)
		if err != nil {
			t.Fatal(err)
		}
		if r.Node != "t4" {
			t.Errorf("among T4 nodes (over-demand cost %v): %s, want t4", d.overdemand != nil, r.Node)
		}
	}
}

// TestStrandChangeCountsTakenGPU: on a node of an over-demanded product a
// placement's stranded GPU is FGD's measure plus the milli GPU it takes
// times the mix's weight; elsewhere FGD's measure alone.
func TestStrandChangeCountsTakenGPU(t *testing.T) {
	g2, t4, w := overdemandCluster(t)
	weight, plain := mixWeight(w), withoutOverdemand(w)
	whole := Request{GPUs: 1, Host: Host{CPUMilli: 8000}}
	share := Request{Share: &ShareRequest{Cores: 47, MemoryBytes: 1 << 20}, Host: Host{CPUMilli: 8000}}
	cases := []struct {
		name  string
		node  *NodeState
		req   Request
		taken int64
	}{
		{"whole GPU on T4", t4, whole, 1000},
		{"share on T4", t4, share, 470},
		{"whole GPU on G2", g2, whole, 0},
		{"share on G2", g2, share, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := ScoreNode(c.node, c.req, Policy{Node: Binpack, GPU: Binpack, Demand: w})
			if err != nil || !ok {
				t.Fatalf("ScoreNode: %v, fits %v", err, ok)
			}
			base, _, _ := ScoreNode(c.node, c.req, Policy{Node: Binpack, GPU: Binpack, Demand: plain})
			if got.Stranded()-base.Stranded() != c.taken*weight {
				t.Errorf("stranded %d, FGD's measure %d: the difference is %d, want %d milli GPU times the weight %d",
					got.Stranded(), base.Stranded(), got.Stranded()-base.Stranded(), c.taken, weight)
			}
		})
	}
}

// TestOverdemandCostsFeedableGPUOnly: a placement on a node of an
// over-demanded product costs the GPU its pinned pods could still be fed
// on there and no more: on a node whose cores feed 2 of its 4 GPUs at the
// pinned pods' 16 cores per GPU, a whole GPU with no cores costs nothing
// and one with 8 cores costs the half GPU those cores would feed; on a
// node whose cores feed all of its GPUs, the whole GPU.
func TestOverdemandCostsFeedableGPUOnly(t *testing.T) {
	pinnedHost := Host{CPUMilli: 16000, MemoryBytes: 8 * gib}
	m := mustDemand(t, map[DemandShape]int{
		{GPUs: 1, Host: pinnedHost, Products: "T4"}: 3,
		{GPUs: 1}: 1,
	})
	poor := nodeNow(t, 4, Host{CPUMilli: 32000, MemoryBytes: 512 * gib}, "T4", 0)
	rich := nodeNow(t, 4, Host{CPUMilli: 128000, MemoryBytes: 512 * gib}, "T4", 0)
	// T4 is 8 of 16 GPUs and 3 of the 4 GPUs asked for.
	w := m.WithScarcity([]*NodeState{nodeNow(t, 8, Host{CPUMilli: 96000, MemoryBytes: 512 * gib}, "G2", 0), poor, rich})
	if got := w.Overdemanded(); !slices.Equal(got, []string{"T4"}) {
		t.Fatalf("Overdemanded = %v, want [T4]", got)
	}
	weight, plain := mixWeight(w), withoutOverdemand(w)
	cases := []struct {
		name string
		node *NodeState
		cpu  int64
		cost int64 // milli GPU the pinned pods can no longer be fed on
	}{
		{"CPU-poor node, a GPU without cores: the GPU the cores cannot feed", poor, 0, 0},
		{"CPU-poor node, a GPU with 8 cores: what those cores feed", poor, 8000, 500},
		{"CPU-poor node, a GPU with 32 cores: all the node could feed", poor, 32000, 2000},
		{"CPU-rich node, a GPU with 8 cores: the GPU", rich, 8000, 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := Request{GPUs: 1, Host: Host{CPUMilli: c.cpu}}
			got, ok, err := ScoreNode(c.node, req, Policy{Node: Binpack, GPU: Binpack, Demand: w})
			if err != nil || !ok {
				t.Fatalf("ScoreNode: %v, fits %v", err, ok)
			}
			base, _, _ := ScoreNode(c.node, req, Policy{Node: Binpack, GPU: Binpack, Demand: plain})
			if diff := got.Stranded() - base.Stranded(); diff != c.cost*weight {
				t.Errorf("cost %d, want %d milli GPU times the weight %d (%d)", diff, c.cost, weight, c.cost*weight)
			}
		})
	}
}

// mixWeight is the mix's total weight: what the over-demand cost charges
// per milli GPU.
func mixWeight(m *DemandMix) int64 {
	var w int64
	for i := range m.shapes {
		w += m.weight(i)
	}
	return w
}

// withoutOverdemand is m as the scarcity weighing alone leaves it.
func withoutOverdemand(m *DemandMix) *DemandMix {
	plain := *m
	plain.overdemand = nil
	return &plain
}
