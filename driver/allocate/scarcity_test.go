package allocate

import (
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// nodeNow is a node of gpus PIX-linked GPUs of the given product, the
// first givenOut of them given out whole, with host left for pods.
func nodeNow(tb testing.TB, gpus int, host Host, product string, givenOut int) *NodeState {
	tb.Helper()
	topo := generated(tb, gpus, 16, func(i, j int) string { return "PIX" })
	if product != "" {
		topo = withProduct(tb, topo, product)
	}
	n := &NodeState{Name: "n", Topology: topo, Usage: make([]GPUUsage, gpus), Host: &host}
	for p := range givenOut {
		n.Usage[p].Exclusive = true
	}
	return n
}

// strandedAll is what a node strands for w when its host fits no shape:
// every shape's weight times the node's GPU left, in milli GPU.
func strandedAll(w *DemandMix) int64 { return w.stranded([]int32{1000}, &Host{}, "") }

func TestWithScarcity(t *testing.T) {
	common := DemandShape{GPUs: 1, Host: Host{CPUMilli: 8000, MemoryBytes: 32 * gib}}
	big := DemandShape{GPUs: 8, Host: Host{CPUMilli: 120000, MemoryBytes: 720 * gib}}
	never := DemandShape{GPUs: 8, Host: Host{CPUMilli: 200000}}
	m := mustDemand(t, map[DemandShape]int{common: 5, big: 2, never: 3})
	commonHost := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	bigHost := Host{CPUMilli: 128000, MemoryBytes: 768 * gib}
	// Nine common nodes (72 GPUs), two large ones (16) and two with too
	// few GPUs for big, whatever their host (8): 96 GPUs.
	cluster := func(large ...*NodeState) []*NodeState {
		var nodes []*NodeState
		for range 9 {
			nodes = append(nodes, nodeNow(t, 8, commonHost, "", 0))
		}
		nodes = append(nodes, large...)
		for range 2 {
			nodes = append(nodes, nodeNow(t, 4, Host{CPUMilli: 256000, MemoryBytes: 2048 * gib}, "", 0))
		}
		return nodes
	}
	weighs := func(wantBig int64) int64 { return (5*scarcityScale + 2*wantBig + 3*scarcityScale) * 1000 }
	cases := []struct {
		name    string
		nodes   []*NodeState
		wantBig int64 // big's scarcity; common and never keep the least
	}{
		{"idle: big runs on 16 of 96 GPUs (x6)", cluster(nodeNow(t, 8, bigHost, "", 0), nodeNow(t, 8, bigHost, "", 0)), 6 * scarcityScale},
		{"one large node half given out: big runs on 8 of 92 (x11.5)",
			cluster(nodeNow(t, 8, bigHost, "", 4), nodeNow(t, 8, bigHost, "", 0)), 92 * scarcityScale / 8},
		{"one large node's cores taken by pods: 8 of 96 (x12)",
			cluster(nodeNow(t, 8, Host{CPUMilli: 100000, MemoryBytes: 768 * gib}, "", 0), nodeNow(t, 8, bigHost, "", 0)), 12 * scarcityScale},
		{"no node could run big now: the least weight",
			cluster(nodeNow(t, 8, bigHost, "", 1), nodeNow(t, 8, bigHost, "", 1)), scarcityScale},
		{"no nodes", nil, scarcityScale},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, want := strandedAll(m.WithScarcity(c.nodes)), weighs(c.wantBig); got != want {
				t.Errorf("stranded = %d, want %d", got, want)
			}
		})
	}
	if got, want := strandedAll(m), int64(5+2+3)*1000; got != want {
		t.Errorf("the original mix changed: stranded = %d, want %d", got, want)
	}
}

// TestWithScarcityByProduct: a shape pinned to a product is weighed by
// the unallocated GPU of that product's nodes only, and a node of another
// product strands all of its GPU for it.
func TestWithScarcityByProduct(t *testing.T) {
	host := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	anywhere := DemandShape{GPUs: 1, Host: host}
	pinned := DemandShape{GPUs: 1, Host: host, Products: ProductsKey([]string{"T4"})}
	m := mustDemand(t, map[DemandShape]int{anywhere: 3, pinned: 1})
	big := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	cluster := func(t4GivenOut ...int) []*NodeState {
		nodes := []*NodeState{nodeNow(t, 8, big, "G2", 0), nodeNow(t, 8, big, "G2", 0), nodeNow(t, 8, big, "G2", 0)}
		for _, g := range t4GivenOut {
			nodes = append(nodes, nodeNow(t, 2, big, "T4", g))
		}
		return nodes
	}
	// 28 GPUs; the T4 ones 4: pinned x7, anywhere x1.
	w := m.WithScarcity(cluster(0, 0))
	if got, want := w.stranded([]int32{1000, 1000}, &big, "T4"), int64(0); got != want {
		t.Errorf("T4 node, both fit: stranded = %d, want %d", got, want)
	}
	if got, want := w.stranded([]int32{1000, 1000}, &big, "G2"), int64(7*scarcityScale*2000); got != want {
		t.Errorf("G2 node: stranded = %d, want the pinned shape's weight times all its GPU, %d", got, want)
	}
	// One T4 node's GPUs given out: 2 of 26 left are T4 (x13).
	if got, want := m.WithScarcity(cluster(2, 0)).stranded([]int32{1000}, &big, "G2"), int64(13*scarcityScale*1000); got != want {
		t.Errorf("T4 half given out: stranded = %d, want %d", got, want)
	}
	// Every T4 given out: the pinned shape runs nowhere, and a G2 GPU
	// strands it no more than anything else does.
	if got, want := m.WithScarcity(cluster(2, 2)).stranded([]int32{1000}, &big, "G2"), int64(scarcityScale*1000); got != want {
		t.Errorf("T4 all given out: stranded = %d, want %d", got, want)
	}
}

// TestWithScarcitySkipsNodesWithoutGPUs: a node without GPUs, or with
// none left, adds no supply.
func TestWithScarcitySkipsNodesWithoutGPUs(t *testing.T) {
	host := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	one := DemandShape{GPUs: 1, Host: host}
	two := DemandShape{GPUs: 2, Host: host}
	m := mustDemand(t, map[DemandShape]int{one: 1, two: 1})
	big := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	nodes := []*NodeState{
		nodeNow(t, 2, big, "", 0), nodeNow(t, 2, big, "", 2), nodeNow(t, 1, big, "", 0), nodeNow(t, 1, big, "", 0),
		{Name: "cpu"}, {Name: "empty", Topology: &topology.Topology{}}, nil,
	}
	// 4 GPUs left; two runs on the idle pair only (x2).
	if got, want := strandedAll(m.WithScarcity(nodes)), int64(scarcityScale+2*scarcityScale)*1000; got != want {
		t.Errorf("stranded = %d, want %d", got, want)
	}
}

// BenchmarkWithScarcity5000Nodes: the weighing the controller does once
// per new snapshot of the demand mix (not per decision), at the scale
// test's size: 5,000 8-GPU nodes of four products, every third one with
// 0-8 of its GPUs given out, and 128 shapes (whole and shares, about a
// quarter pinned).
func BenchmarkWithScarcity5000Nodes(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	products := []string{"A100", "H100", "V100", "T4"}
	nodes := make([]*NodeState, 5000)
	for i := range nodes {
		nodes[i] = nodeNow(b, 8, Host{CPUMilli: 96000 - int64(rng.IntN(64))*1000, MemoryBytes: 384 * gib}, products[i%len(products)], rng.IntN(9)*(i%3/2))
	}
	counts := map[DemandShape]int{}
	for len(counts) < 128 {
		s := DemandShape{GPUs: 1 << rng.IntN(4), Host: Host{CPUMilli: int64(1+rng.IntN(32)) * 1000, MemoryBytes: int64(1+rng.IntN(64)) * gib}}
		if rng.IntN(3) == 0 {
			s.GPUs, s.ShareMilli = 1, 100*(1+rng.IntN(9))
		}
		if rng.IntN(4) == 0 {
			s.Products = products[rng.IntN(len(products))]
		}
		counts[s] = 1 + rng.IntN(50)
	}
	m := mustDemand(b, counts)
	b.ReportAllocs()
	for b.Loop() {
		_ = m.WithScarcity(nodes)
	}
}
