package allocate

import (
	"slices"
	"testing"
)

// Reserve: the nodes the steering's second taint keeps whole, on shapes
// and nodes of FGD's trace (docs/performance/trace.md): the pods asking
// for 8 GPUs with 120 cores and 720 GiB (openb-pod-6602) fit only the G3
// nodes (8 GPUs, 128 cores, 768 GiB), which in the trace hold 312 of the
// 6,212 GPUs; a G2 node has 8 GPUs with 96 cores and 384 GiB. Before the
// second taint, the pods without GPUs took 15-16 cores of every idle G3
// node (kube-scheduler's LeastAllocated prefers the largest nodes), and
// the 8-GPU pods failed from 24 % of the trace's arrivals on.
func TestDemandMixReserve(t *testing.T) {
	g3Host := Host{CPUMilli: 128000, MemoryBytes: 768 * gib}
	g2Host := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	t4Host := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	whole := DemandShape{GPUs: 8, Host: Host{CPUMilli: 120000, MemoryBytes: 720 * gib}}
	small := DemandShape{GPUs: 1, Host: Host{CPUMilli: 4000, MemoryBytes: 16 * gib}}
	pinnedT4 := DemandShape{GPUs: 1, Host: Host{CPUMilli: 8000, MemoryBytes: 32 * gib}, Products: "T4"}
	// About the trace's proportions, kept small: 1 G3 and 20 G2 nodes
	// (160 GPUs) and 2 T4 nodes of 4 GPUs with 96 cores: the G3 holds 8
	// of the 176 unallocated GPUs (22 times less than all), the T4 nodes
	// 8.
	var nodes []*NodeState
	nodes = append(nodes, nodeNow(t, 8, g3Host, "G3", 0))
	for range 20 {
		nodes = append(nodes, nodeNow(t, 8, g2Host, "G2", 0))
	}
	for range 2 {
		nodes = append(nodes, nodeNow(t, 4, t4Host, "T4", 0))
	}
	mix := mustDemand(t, map[DemandShape]int{whole: 1, small: 500, pinnedT4: 50}).WithScarcity(nodes)
	// The same shapes when the T4 nodes hold half the unallocated GPU:
	// the pinned shape is not scarce then.
	plentyT4 := mustDemand(t, map[DemandShape]int{small: 500, pinnedT4: 50}).WithScarcity([]*NodeState{
		nodeNow(t, 8, g2Host, "G2", 0), nodeNow(t, 4, t4Host, "T4", 0), nodeNow(t, 4, t4Host, "T4", 0)})
	oneTaken := make([]GPUUsage, 8)
	oneTaken[3].Exclusive = true
	shared := make([]GPUUsage, 8)
	shared[0] = GPUUsage{Shares: 1, MemoryBytes: gib}
	cases := []struct {
		name    string
		mix     *DemandMix
		product string
		gpus    int
		usage   []GPUUsage
		host    Host
		want    bool
	}{
		{"idle G3: only it runs the 8-GPU 120-core shape", mix, "G3", 8, nil, g3Host, true},
		{"G3 with 16 cores taken: the shape no longer fits", mix, "G3", 8, nil,
			Host{CPUMilli: g3Host.CPUMilli - 16000, MemoryBytes: g3Host.MemoryBytes}, false},
		{"G3 with one GPU given out", mix, "G3", 8, oneTaken, g3Host, false},
		{"G3 with one GPU shared", mix, "G3", 8, shared, g3Host, false},
		{"idle G2: every shape that fits it runs on most nodes", mix, "G2", 8, nil, g2Host, false},
		{"idle T4, the pinned shape's 8 of 176 GPUs", mix, "T4", 4, nil, t4Host, true},
		{"idle T4 where T4 holds half the GPU", plentyT4, "T4", 4, nil, t4Host, false},
		{"mix without scarcity", mustDemand(t, map[DemandShape]int{whole: 1, small: 500}), "G3", 8, nil, g3Host, false},
		{"no mix", nil, "G3", 8, nil, g3Host, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			topo := withProduct(t, pcieSwitch8(t), c.product)
			if c.gpus == 4 {
				topo = withProduct(t, pcie4(t), c.product)
			}
			host := c.host
			n := &NodeState{Name: "n", Topology: topo, Usage: c.usage, Host: &host}
			if c.usage == nil {
				n.Usage = make([]GPUUsage, topo.Len())
			}
			if got := c.mix.Reserve(n); got != c.want {
				t.Errorf("Reserve = %v, want %v", got, c.want)
			}
		})
	}
}

// KeepForScarce: a share pinned to a model of one GPU per node among
// hundreds of GPUs (the trace's A10) keeps the node's shared GPU from
// pods without GPUs while it can still run there; a shape scarce enough
// for Reserve only does not.
func TestDemandMixKeepForScarce(t *testing.T) {
	a10Host := Host{CPUMilli: 128000, MemoryBytes: 512 * gib}
	g2Host := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	a10Share := DemandShape{GPUs: 1, ShareMilli: 160, Host: Host{CPUMilli: 6000, MemoryBytes: 16 * gib}, Products: "A10"}
	small := DemandShape{GPUs: 1, ShareMilli: 250, Host: Host{CPUMilli: 4000, MemoryBytes: 16 * gib}}
	pinnedT4 := DemandShape{GPUs: 1, Host: Host{CPUMilli: 8000, MemoryBytes: 32 * gib}, Products: "T4"}
	// A GPU of 16 GiB with 4 GiB of it shared: 750 milli left.
	sharedA10 := nodeNow(t, 1, a10Host, "A10", 0)
	sharedA10.Usage[0] = GPUUsage{Shares: 1, MemoryBytes: 4 * gib, Cores: 20}
	var nodes []*NodeState
	for range 40 {
		nodes = append(nodes, nodeNow(t, 8, g2Host, "G2", 0))
	}
	// 320 G2 GPUs and the A10's 0.75: the A10 share is weighed about 427
	// times; the T4 nodes' 8 GPUs make the pinned T4 shape 41 times.
	tightA10 := mustDemand(t, map[DemandShape]int{a10Share: 20, small: 500}).WithScarcity(append(slices.Clone(nodes), sharedA10))
	tightT4 := mustDemand(t, map[DemandShape]int{pinnedT4: 20, small: 500}).WithScarcity(append(slices.Clone(nodes),
		nodeNow(t, 4, g2Host, "T4", 0), nodeNow(t, 4, g2Host, "T4", 0)))
	sharedT4 := nodeNow(t, 4, g2Host, "T4", 0)
	sharedT4.Usage[0] = GPUUsage{Shares: 1, MemoryBytes: 4 * gib, Cores: 20}
	withHost := func(n *NodeState, h Host) *NodeState {
		c := *n
		c.Host = &h
		return &c
	}
	withUsage := func(n *NodeState, u GPUUsage) *NodeState {
		c := *n
		c.Usage = []GPUUsage{u}
		return &c
	}
	cases := []struct {
		name string
		mix  *DemandMix
		node *NodeState
		want bool
	}{
		{"shared A10 the pinned share still fits", tightA10, sharedA10, true},
		{"shared A10 with 4 cores left, the share needs 6", tightA10, withHost(sharedA10, Host{CPUMilli: 4000, MemoryBytes: a10Host.MemoryBytes}), false},
		{"A10 with 100 milli left, the share needs 160", tightA10, withUsage(sharedA10, GPUUsage{Shares: 3, MemoryBytes: 14*gib + gib/2, Cores: 90}), false},
		{"idle G2: no scarce shape runs on it", tightA10, nodes[0], false},
		{"T4 shared: the pinned T4 shape is scarce for Reserve, not here", tightT4, sharedT4, false},
		{"no mix", nil, sharedA10, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.mix.KeepForScarce(c.node); got != c.want {
				t.Errorf("KeepForScarce = %v, want %v", got, c.want)
			}
		})
	}
	if !tightT4.Reserve(nodeNow(t, 4, g2Host, "T4", 0)) {
		t.Error("the idle T4 node is not reserved: the case above would not tell the two thresholds apart")
	}
}
