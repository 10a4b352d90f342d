package tracebench

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func testCluster(t *testing.T, nodes ...Node) *Cluster {
	t.Helper()
	for i := range nodes {
		if nodes[i].Name == "" {
			nodes[i].Name = "n" + itoa(int64(i))
		}
	}
	c, err := newCluster(nodes, newKindSet(testTopologies))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// use places work on a node by hand: each milli value on the next GPU.
func use(t *testing.T, c *Cluster, node int, cpu int64, milli ...int) {
	t.Helper()
	for g, m := range milli {
		if m == 0 {
			continue
		}
		task := &Task{Name: "pre", GPUs: 1, GPUMilli: m}
		if g == 0 {
			task.CPUMilli = cpu
		}
		if err := c.apply(task, Placement{Node: node, GPUs: []int{g}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(milli) == 0 {
		if err := c.apply(&Task{Name: "pre", CPUMilli: cpu}, Placement{Node: node}); err != nil {
			t.Fatal(err)
		}
	}
}

func place(t *testing.T, name string, c *Cluster, task *Task, w *Workload) Placement {
	t.Helper()
	if w == nil {
		w = NewWorkload([]Task{*task})
	}
	p, err := newPolicy(name, w, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	pl, ok, err := p.place(c, task)
	if err != nil || !ok {
		t.Fatalf("%s: ok=%v err=%v", name, ok, err)
	}
	return pl
}

func TestFragmentationByHand(t *testing.T) {
	// M: one class of a half-GPU share (1 CPU core), one of a whole GPU
	// (1 core), equally popular.
	w := NewWorkload([]Task{
		{GPUs: 1, GPUMilli: 500, CPUMilli: 1000},
		{GPUs: 1, GPUMilli: 1000, CPUMilli: 1000},
	})
	frag := func(model string, cpu int64, left ...int32) float64 {
		return float64(w.fragScaled(w.accessFor(model), cpu, 1<<20, left)) / float64(w.total)
	}
	// GPUs with 300 and 1000 left: both classes can run; for each, the
	// 300 GPU is too small: F = 0.5*300 + 0.5*300.
	if got := frag("T4", 8000, 300, 1000); got != 300 {
		t.Errorf("300+1000 free: F = %v, want 300", got)
	}
	// 600 and 1000 left: the share fits both (no fragment), the whole
	// GPU only the second (600 is fragment): F = 0.5*0 + 0.5*600.
	if got := frag("T4", 8000, 600, 1000); got != 300 {
		t.Errorf("600+1000 free: F = %v, want 300", got)
	}
	// 300 and 300: neither class can run: all 600 free are fragment.
	if got := frag("T4", 8000, 300, 300); got != 600 {
		t.Errorf("300+300 free: F = %v, want 600", got)
	}
	// Short of CPU: nothing can run, all 1300 free are fragment.
	if got := frag("T4", 500, 300, 1000); got != 1300 {
		t.Errorf("no CPU: F = %v, want 1300", got)
	}
	// No GPU free: no fragment.
	if got := frag("T4", 8000, 0, 0); got != 0 {
		t.Errorf("full: F = %v, want 0", got)
	}
	// A model constraint: a class that runs on V100 only sees a T4 node
	// as all fragment.
	wv := NewWorkload([]Task{{GPUs: 1, GPUMilli: 1000, CPUMilli: 1000, Models: []string{"V100M16"}}})
	if got := float64(wv.fragScaled(wv.accessFor("T4"), 8000, 1<<20, []int32{1000, 1000})) / float64(wv.total); got != 2000 {
		t.Errorf("model excluded: F = %v, want 2000", got)
	}
	// Cluster: the rate is fragment over unallocated GPU.
	c := testCluster(t, Node{CPUMilli: 8000, MemoryMiB: 1 << 20, GPUs: 2, Model: "T4"}, Node{CPUMilli: 8000, MemoryMiB: 1 << 20, GPUs: 2, Model: "T4"})
	use(t, c, 0, 0, 700) // node 0: 300 + 1000 free, F = 300
	f, idle := w.clusterFrag(c)
	if f != 300 || idle != 3300 {
		t.Errorf("cluster: F = %v, idle %d; want 300 of 3300", f, idle)
	}
}

func TestBaselineChoices(t *testing.T) {
	big := func(model string, gpus int) Node {
		return Node{CPUMilli: 64000, MemoryMiB: 256 << 10, GPUs: gpus, Model: model}
	}
	share := &Task{Name: "s", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 500}

	t.Run("first fit takes the first node and GPU that fit", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("T4", 2))
		use(t, c, 0, 0, 0, 800) // node 0: GPU 1 too full for the share
		if got := place(t, PolicyFirstFit, c, share, nil); !reflect.DeepEqual(got, Placement{Node: 0, GPUs: []int{0}}) {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("best fit takes the node with least left", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("T4", 2), big("T4", 2))
		use(t, c, 2, 32000, 200) // node 2: half its CPU and 200 milli used
		if got := place(t, PolicyBestFit, c, share, nil); got.Node != 2 || got.GPUs[0] != 0 {
			t.Errorf("got %+v, want node 2 GPU 0 (tightest)", got)
		}
	})
	t.Run("best fit and the others skip nodes short of CPU", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("T4", 2))
		use(t, c, 0, 63500, 200) // node 0 fuller but only 500 millicores left
		for _, p := range []string{PolicyBestFit, PolicyFGD, PolicyPacking, PolicyClustering, PolicyDotProduct, PolicyFirstFit, PolicyRandomFit, PolicyGpulinkCPUPods} {
			if got := place(t, p, c, share, nil); got.Node != 1 {
				t.Errorf("%s: got %+v, want node 1", p, got)
			}
		}
	})
	t.Run("a gpu_spec keeps tasks to their models", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("V100M16", 8))
		v := &Task{Name: "v", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 1000, Models: []string{"V100M16", "V100M32"}}
		for _, p := range append([]string{PolicyGpulinkCPUPods}, AllPolicies...) {
			if got := place(t, p, c, v, nil); got.Node != 1 {
				t.Errorf("%s: got %+v, want the V100 node", p, got)
			}
		}
	})
	t.Run("gpu packing prefers a GPU already holding work", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("T4", 4), big("T4", 2))
		use(t, c, 1, 0, 0, 0, 300) // node 1 GPU 2 holds 300
		if got := place(t, PolicyPacking, c, share, nil); !reflect.DeepEqual(got, Placement{Node: 1, GPUs: []int{2}}) {
			t.Errorf("got %+v", got)
		}
		// A whole GPU: a used node before an idle one.
		whole := &Task{Name: "w", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, GPUMilli: 1000}
		if got := place(t, PolicyPacking, c, whole, nil); got.Node != 1 {
			t.Errorf("whole: got %+v, want node 1", got)
		}
	})
	t.Run("gpu clustering keeps one demand together", func(t *testing.T) {
		c := testCluster(t, big("T4", 4), big("T4", 4), big("T4", 4))
		use(t, c, 0, 0, 300)      // node 0 holds a 300 share
		use(t, c, 1, 0, 500)      // node 1 holds a 500 share, like the task
		use(t, c, 2, 0, 500, 300) // node 2 holds both
		if got := place(t, PolicyClustering, c, share, nil); got.Node != 1 {
			t.Errorf("got %+v, want node 1", got)
		}
	})
	t.Run("dot product takes the node least aligned with the task", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("T4", 2))
		use(t, c, 1, 48000, 400) // node 1: little CPU left, GPU 0 half used
		if got := place(t, PolicyDotProduct, c, share, nil); got.Node != 1 || got.GPUs[0] != 0 {
			t.Errorf("got %+v, want node 1 GPU 0", got)
		}
	})
	t.Run("FGD keeps a GPU that the workload's share still fits", func(t *testing.T) {
		// Node 0 has a GPU with 600 left: best fit would put the share
		// there and leave 100, a fragment for every 500 share; FGD takes
		// a fresh GPU, which keeps 500 usable.
		c := testCluster(t, big("T4", 1), big("T4", 1))
		use(t, c, 0, 0, 400)
		w := NewWorkload([]Task{*share})
		if got := place(t, PolicyFGD, c, share, w); got.Node != 1 {
			t.Errorf("fgd: got %+v, want node 1", got)
		}
		if got := place(t, PolicyBestFit, c, share, w); got.Node != 0 {
			t.Errorf("best-fit: got %+v, want node 0", got)
		}
	})
	t.Run("random fit only picks nodes that fit", func(t *testing.T) {
		c := testCluster(t, big("T4", 1), big("T4", 1), big("T4", 1))
		use(t, c, 0, 0, 900)
		use(t, c, 2, 0, 900)
		for seed := range uint64(20) {
			p, _ := newPolicy(PolicyRandomFit, nil, rand.New(rand.NewPCG(seed, 0)))
			if got, ok, err := p.place(c, share); err != nil || !ok || got.Node != 1 {
				t.Fatalf("seed %d: %+v %v %v", seed, got, ok, err)
			}
		}
	})
	t.Run("gpulink takes an NVLink pair and packs shares", func(t *testing.T) {
		c := testCluster(t, big("V100M32", 8))
		pair := &Task{Name: "p", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 2, GPUMilli: 1000}
		got := place(t, PolicyGpulinkCPUPods, c, pair, nil)
		if l := weakest(c.nodes[0], got.GPUs); l < topology.NVLink(2) {
			t.Errorf("pair %v on %s, want NV2", got.GPUs, l)
		}
		if got := place(t, PolicyFirstFit, c, pair, nil); weakest(c.nodes[0], got.GPUs) != c.nodes[0].kind.topo.Link(0, 1) {
			t.Errorf("first fit should take GPUs 0,1: %+v", got)
		}
		use(t, c, 0, 0, 0, 0, 0, 300) // GPU 3 holds a share
		if got := place(t, PolicyGpulinkCPUPods, c, share, nil); got.GPUs[0] != 3 {
			t.Errorf("share on %+v, want GPU 3 (already shared)", got)
		}
	})
	t.Run("CPU-only tasks: kube-scheduler defaults spread, MostAllocated packs, gpulink keeps GPUs usable", func(t *testing.T) {
		c := testCluster(t, big("T4", 2), big("T4", 2))
		// Node 0 half used in CPU and memory alike (BalancedAllocation
		// then scores both nodes the same).
		if err := c.apply(&Task{Name: "pre", CPUMilli: 32000, MemoryMiB: 128 << 10}, Placement{Node: 0}); err != nil {
			t.Fatal(err)
		}
		cpu := &Task{Name: "c", CPUMilli: 4000, MemoryMiB: 1024}
		if got := place(t, PolicyGpulinkNoSteer, c, cpu, nil); got.Node != 1 {
			t.Errorf("LeastAllocated: got %+v, want the emptier node 1", got)
		}
		// Both nodes have idle GPUs, so both carry the steering taint:
		// the taint ranks them alike and LeastAllocated decides.
		if got := place(t, PolicyGpulink, c, cpu, nil); got.Node != 1 {
			t.Errorf("LeastAllocated among tainted nodes: got %+v, want the emptier node 1", got)
		}
		if got := place(t, PolicyGpulinkMost, c, cpu, nil); got.Node != 0 {
			t.Errorf("MostAllocated: got %+v, want the fuller node 0", got)
		}
		// GPU tasks to come need 30 cores: node 0 has 32 left, so the
		// CPU-only task there would strand both its GPUs; gpulink
		// (allocate.ChooseHost) puts it on node 1, where they stay usable.
		w := NewWorkload([]Task{{GPUs: 1, GPUMilli: 1000, CPUMilli: 30000, MemoryMiB: 1024}})
		if got := place(t, PolicyGpulinkCPUPods, c, cpu, w); got.Node != 1 {
			t.Errorf("gpulink: got %+v, want node 1, where the GPUs keep their CPU", got)
		}
		// Without that shape to come it packs, as MostAllocated.
		if got := place(t, PolicyGpulinkCPUPods, c, cpu, nil); got.Node != 0 {
			t.Errorf("gpulink, no GPU task known: got %+v, want the fuller node 0", got)
		}
	})
}

func TestApplyRefusesOverfullPlacements(t *testing.T) {
	c := testCluster(t, Node{CPUMilli: 4000, MemoryMiB: 4096, GPUs: 2, Model: "T4"})
	use(t, c, 0, 0, 700)
	if err := c.apply(&Task{Name: "x", GPUs: 1, GPUMilli: 500}, Placement{Node: 0, GPUs: []int{0}}); err == nil {
		t.Error("a share larger than the GPU's rest was applied")
	}
	if err := c.apply(&Task{Name: "x", CPUMilli: 5000}, Placement{Node: 0}); err == nil {
		t.Error("more CPU than the node has was applied")
	}
	if err := c.apply(&Task{Name: "x", GPUs: 2, GPUMilli: 1000}, Placement{Node: 0, GPUs: []int{1, 1}}); err == nil {
		t.Error("a GPU twice was applied")
	}
}

// synthTrace is a small made-up trace: every model the mapping knows, and
// tasks of every shape, so replays run without ../shared.
func synthTrace() *Trace {
	tr := &Trace{List: "synthetic"}
	models := []struct {
		m    string
		gpus int
	}{{"G2", 8}, {"T4", 2}, {"V100M32", 8}, {"V100M16", 4}, {"P100", 2}, {"G3", 8}, {"A10", 1}, {"T4", 4}}
	for i := range 40 {
		k := models[i%len(models)]
		tr.Nodes = append(tr.Nodes, Node{Name: "node-" + itoa(int64(100+i)), CPUMilli: 64000, MemoryMiB: 256 << 10, GPUs: k.gpus, Model: k.m})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 300 {
		t := Task{Name: "t" + itoa(int64(i)), CPUMilli: int64(1000 * (1 + rng.IntN(16))), MemoryMiB: int64(1024 * (1 + rng.IntN(64)))}
		switch r := rng.IntN(10); {
		case r < 1:
		case r < 5:
			t.GPUs, t.GPUMilli = 1, 10*(5+rng.IntN(95))
		case r < 8:
			t.GPUs, t.GPUMilli = 1, 1000
		default:
			t.GPUs, t.GPUMilli = []int{2, 4, 8}[rng.IntN(3)], 1000
		}
		if rng.IntN(20) == 0 && t.GPUs > 0 {
			t.Models = []string{"V100M16", "V100M32"}
		}
		tr.Tasks = append(tr.Tasks, t)
	}
	return tr
}

func TestReplayDeterministicPerSeed(t *testing.T) {
	tr := synthTrace()
	opt := Options{TopologyDir: testTopologies, Seeds: []uint64{1, 2}, Workers: 2}
	a, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	opt.Workers = 1
	b, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two replays with the same seeds differ")
	}
	if len(a.Runs) != 2*len(AllPolicies) || len(a.StepPercents()) != 13 {
		t.Fatalf("%d runs, steps %v", len(a.Runs), a.StepPercents())
	}
	if reflect.DeepEqual(a.Runs[0].Steps, a.Runs[len(AllPolicies)].Steps) {
		t.Error("seeds 1 and 2 gave the same replay")
	}
	for _, r := range a.Runs {
		last := r.Steps[len(r.Steps)-1]
		// Past 100 % arrived at least the excess cannot be allocated.
		if last.Failed < last.Arrived-r.Capacity {
			t.Errorf("%s seed %d: %d failed of %d arrived on %d", r.Policy, r.Seed, last.Failed, last.Arrived, r.Capacity)
		}
		if last.Idle != r.Capacity-(last.Arrived-last.Failed) {
			t.Errorf("%s seed %d: idle %d is not capacity less allocated", r.Policy, r.Seed, last.Idle)
		}
	}
	if s := a.Summarize(PolicyGpulinkCPUPods, 12); s.IdealShare != 1 && s.Multi > 0 {
		t.Logf("gpulink ideal-class share %.3f", s.IdealShare)
	}
}

func TestReplayRealTraceQuick(t *testing.T) {
	tr, err := Load(sharedTrace, "default")
	if err != nil {
		t.Skipf("FGD's trace is not at %s: %v", sharedTrace, err)
	}
	r, err := Replay(tr, Options{TopologyDir: testTopologies, Seeds: []uint64{1}, NodeStride: 16, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Nodes != 76 {
		t.Errorf("%d nodes with stride 16", r.Nodes)
	}
	for _, p := range r.Policies {
		s := r.Summarize(p, len(r.StepPercents())-1)
		if s.Unalloc < 30 || s.FragRate <= 0 || s.FragRate > 100 {
			t.Errorf("%s at 130 %%: unallocated %.2f %% (must be at least the 30 %% excess), fragmentation %.1f %%", p, s.Unalloc, s.FragRate)
		}
	}
}

// TestFGDPaperScore: the artifact's score is sigmoid of the fragment
// removed (milli GPU, over 1000) times 100, truncated: no change is 50,
// a fragment grown by 2 GPUs 11, removed by 1 GPU 73, and changes far
// apart in size can share a score.
func TestFGDPaperScore(t *testing.T) {
	for _, c := range []struct {
		before, after float64
		want          int64
	}{{5000, 5000, 50}, {0, 2000, 11}, {1000, 0, 73}, {0, 10000, 0}, {0, 20000, 0}} {
		if got := fgdPaperScore(c.before, c.after); got != c.want {
			t.Errorf("fgdPaperScore(%v, %v) = %d, want %d", c.before, c.after, got, c.want)
		}
	}
}

// TestIgnoreMemory: with Options.IgnoreMemory a task asking for more
// memory than any node has is placed (every policy), as in the paper's
// simulator; without it, it fails.
func TestIgnoreMemory(t *testing.T) {
	tr := &Trace{List: "mem", Nodes: []Node{{Name: "n", CPUMilli: 64000, MemoryMiB: 1024, GPUs: 2, Model: "P100"}},
		Tasks: []Task{{Name: "big", CPUMilli: 1000, MemoryMiB: 4096, GPUs: 1, GPUMilli: 1000}}}
	for _, ignore := range []bool{false, true} {
		r, err := Replay(tr, Options{TopologyDir: testTopologies, Seeds: []uint64{1}, Policies: []string{PolicyFGD, PolicyFGDPaper, PolicyFirstFit}, MaxPercent: 50, StepPercent: 50, IgnoreMemory: ignore})
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range r.Runs {
			if failed := run.Steps[0].FailedTasks > 0; failed == ignore {
				t.Errorf("ignore memory %v, %s: %d tasks failed", ignore, run.Policy, run.Steps[0].FailedTasks)
			}
		}
	}
}
