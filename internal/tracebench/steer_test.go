package tracebench

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// kube-scheduler's TaintToleration NormalizeScore (reverse): 0 for a node
// with the taint when a node without it is among those scored, 100 for
// that node; 100 for every node when none has it, 0 when all have it
// (equal either way).
func TestTaintTolerationScores(t *testing.T) {
	for _, tc := range []struct {
		tainted []int
		want    []int64
	}{
		{[]int{0, 0}, []int64{100, 100}},
		{[]int{1, 1}, []int64{0, 0}},
		{[]int{1, 0, 1}, []int64{0, 100, 0}},
		// Two of gpulink's taints: the count is normalized over the
		// largest among the nodes scored.
		{[]int{2, 1, 0}, []int64{0, 50, 100}},
		{[]int{2, 1, 1}, []int64{0, 50, 50}},
	} {
		if got := taintTolerationScores(tc.tainted); !slices.Equal(got, tc.want) {
			t.Errorf("tainted %v: scores %v, want %v", tc.tainted, got, tc.want)
		}
	}
}

// The steering taint outweighs kube-scheduler's spreading: a CPU-only
// task goes to the node whose GPUs are all taken although it is the
// fuller one, under each condition that leaves that node untainted; a
// node with a whole GPU left stays tainted (and so spreading decides)
// under steerWholeFree but not under steerUsable when no GPU task could
// use that GPU any more.
func TestSteerTaintOutweighsSpreading(t *testing.T) {
	big := func(model string, gpus int) Node {
		return Node{CPUMilli: 64000, MemoryMiB: 256 << 10, GPUs: gpus, Model: model}
	}
	fresh := func() *Cluster {
		c := testCluster(t, big("T4", 2), big("T4", 2), big("T4", 2))
		use(t, c, 0, 32000, 1000, 1000) // node 0: both GPUs taken, half its CPU
		use(t, c, 2, 63000, 1000)       // node 2: one GPU left, 1 core
		return c
	}
	cpu := &Task{Name: "c", CPUMilli: 500, MemoryMiB: 1024}
	// GPU tasks of the mix need 4 cores: node 2's last GPU is stranded.
	w := NewWorkload([]Task{{GPUs: 1, GPUMilli: 1000, CPUMilli: 4000, MemoryMiB: 1024}})
	if got := place(t, PolicyGpulinkNoSteer, fresh(), cpu, w); got.Node != 1 {
		t.Fatalf("no taint: got node %d, want the idle node 1 (LeastAllocated)", got.Node)
	}
	for _, name := range []string{PolicyGpulink, PolicySteerAnyFree, PolicySteerWholeUsable} {
		if got := place(t, name, fresh(), cpu, w); got.Node != 0 {
			t.Errorf("%s: got node %d, want node 0, whose GPUs are all taken", name, got.Node)
		}
	}
	// Node 0 full in CPU: the untainted node does not fit, the task
	// spreads over the tainted ones, and steerUsable adds node 2 (its GPU
	// is stranded) to the untainted.
	full := func() *Cluster {
		c := fresh()
		if err := c.apply(&Task{Name: "fill", CPUMilli: 32000}, Placement{Node: 0}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if got := place(t, PolicyGpulink, full(), cpu, w); got.Node != 1 {
		t.Errorf("%s, node 0 full: got node %d, want node 1 (LeastAllocated among the tainted)", PolicyGpulink, got.Node)
	}
	if got := place(t, PolicySteerUsable, full(), cpu, w); got.Node != 2 {
		t.Errorf("%s, node 0 full: got node %d, want node 2, whose last GPU no task of the mix can use", PolicySteerUsable, got.Node)
	}
}

// TestKubeFeasibleNodesToFind: kube-scheduler's adaptive sample size.
func TestKubeFeasibleNodesToFind(t *testing.T) {
	for _, tc := range []struct{ nodes, want int }{
		{0, 0}, {99, 99}, {100, 100}, // below 100 nodes: all
		{152, 100},   // 49 % is 74: at least 100 (the replay through the controller)
		{250, 120},   // 48 %
		{1213, 497},  // openb: 41 %
		{5000, 500},  // 10 %
		{10000, 500}, // 50 - 80 is below the 5 % floor
	} {
		if got := kubeFeasibleNodesToFind(tc.nodes); got != tc.want {
			t.Errorf("kubeFeasibleNodesToFind(%d) = %d, want %d", tc.nodes, got, tc.want)
		}
	}
}

// TestKubeSchedulerSamples: with kube-scheduler's default sampling a pod
// without GPUs sees only the first 120 feasible nodes of 250 from where
// the pod before it stopped, so the one node without the steering taint
// is missed until the search window reaches it; scoring every node
// (percentageOfNodesToScore: 100) finds it at once.
func TestKubeSchedulerSamples(t *testing.T) {
	const total, full = 250, 200 // node 200: both GPUs taken, no taint
	fresh := func() *Cluster {
		nodes := make([]Node, total)
		for i := range nodes {
			nodes[i] = Node{CPUMilli: 64000, MemoryMiB: 256 << 10, GPUs: 2, Model: "T4"}
		}
		c := testCluster(t, nodes...)
		use(t, c, full, 0, 1000, 1000)
		return c
	}
	cpu := &Task{Name: "c", CPUMilli: 500, MemoryMiB: 1024}
	w := NewWorkload([]Task{{GPUs: 1, GPUMilli: 1000, CPUMilli: 4000, MemoryMiB: 1024}})
	if got := place(t, PolicyGpulinkScoreAll, fresh(), cpu, w); got.Node != full {
		t.Fatalf("%s: got node %d, want the untainted node %d", PolicyGpulinkScoreAll, got.Node, full)
	}
	p, err := newPolicy(PolicyGpulink, w, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	c := fresh()
	var got []int
	for range 2 {
		pl, ok, err := p.place(c, cpu)
		if err != nil || !ok {
			t.Fatalf("ok=%v err=%v", ok, err)
		}
		got = append(got, pl.Node)
	}
	// First window: nodes 0-119, all tainted; second: 120-239, with 200.
	if got[0] >= 120 || got[0] == full || got[1] != full {
		t.Errorf("%s placed the two pods on %v, want one of nodes 0-119, then node %d", PolicyGpulink, got, full)
	}
}

// The steering's second taint (steerScarce) keeps the idle node that
// alone could run a scarce shape off the pods without GPUs: with the
// steering taint alone every node with an idle GPU ranks alike and
// LeastAllocated sends a CPU-only task to the largest node, the G3 node
// the 8-GPU 120-core tasks of FGD's trace need (docs/performance/trace.md:
// how they failed from 24 % arrived on); with the second taint it goes to
// a G2 node, and once the G3 node's CPU is short of the shape anyway the
// second taint is gone.
func TestSteerScarceKeepsWholeNode(t *testing.T) {
	nodes := []Node{{CPUMilli: 128000, MemoryMiB: 768 << 10, GPUs: 8, Model: "G3"}}
	for range 20 {
		nodes = append(nodes, Node{CPUMilli: 96000, MemoryMiB: 384 << 10, GPUs: 8, Model: "G2"})
	}
	w := NewWorkload([]Task{
		{GPUs: 8, GPUMilli: 1000, CPUMilli: 120000, MemoryMiB: 720 << 10},
		{GPUs: 1, GPUMilli: 1000, CPUMilli: 4000, MemoryMiB: 16 << 10},
	})
	cpu := &Task{Name: "c", CPUMilli: 2000, MemoryMiB: 4 << 10}
	if got := place(t, PolicyGpulinkNoScarce, testCluster(t, nodes...), cpu, w); got.Node != 0 {
		t.Fatalf("%s: got node %d, want the G3 node 0 (LeastAllocated among nodes with one taint each)", PolicyGpulinkNoScarce, got.Node)
	}
	if got := place(t, PolicyGpulink, testCluster(t, nodes...), cpu, w); got.Node == 0 {
		t.Errorf("%s: got the G3 node 0, want a G2 node", PolicyGpulink)
	}
	// 10 of the G3 node's cores taken: 118 left, short of the shape's
	// 120, so it has one taint as every other node, and both rank alike.
	short := func() *Cluster {
		c := testCluster(t, nodes...)
		use(t, c, 0, 10000)
		return c
	}
	st := &steerTaint{mode: steerScarce}
	g, err := newGpulinkPolicy(w, nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.scarce = g.demandMix
	for _, tc := range []struct {
		c    *Cluster
		want int
	}{{testCluster(t, nodes...), 2}, {short(), 1}} {
		if got := st.compute(tc.c.nodes[0], st.scarce(tc.c)); got != tc.want {
			t.Errorf("G3 node with %d m CPU left: %d taints, want %d", tc.c.nodes[0].cpuLeft, got, tc.want)
		}
		if got := st.compute(tc.c.nodes[1], st.scarce(tc.c)); got != 1 {
			t.Errorf("idle G2 node: %d taints, want 1", got)
		}
	}
}
