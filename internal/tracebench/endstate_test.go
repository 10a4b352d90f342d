package tracebench

import (
	"strconv"
	"strings"
	"testing"
)

// The end state tells, per GPU model, where the unallocated GPU is and
// who took the rest: a G3 node a CPU-only task took 16 cores of, two G2
// nodes one of which holds a whole-GPU task and a pinned share, and a
// node without GPUs running a CPU-only task, last.
func TestEndState(t *testing.T) {
	c := testCluster(t,
		Node{CPUMilli: 128000, MemoryMiB: 768 << 10, GPUs: 8, Model: "G3"},
		Node{CPUMilli: 96000, MemoryMiB: 384 << 10, GPUs: 8, Model: "G2"},
		Node{CPUMilli: 96000, MemoryMiB: 384 << 10, GPUs: 8, Model: "G2"},
		Node{CPUMilli: 64000, MemoryMiB: 256 << 10})
	use(t, c, 0, 16000)
	if err := c.apply(&Task{Name: "whole", GPUs: 1, GPUMilli: 1000, CPUMilli: 8000}, Placement{Node: 1, GPUs: []int{0}}); err != nil {
		t.Fatal(err)
	}
	if err := c.apply(&Task{Name: "pinned", GPUs: 1, GPUMilli: 500, CPUMilli: 2000, Models: []string{"G2"}}, Placement{Node: 1, GPUs: []int{1}}); err != nil {
		t.Fatal(err)
	}
	use(t, c, 3, 4000)
	rows := endState(c)
	if len(rows) != 3 || rows[0].Model != "G2" || rows[1].Model != "G3" || rows[2].Model != noGPUModel {
		t.Fatalf("rows %+v: want G2, G3, then the nodes without GPUs", rows)
	}
	g2 := rows[0]
	if g2.Nodes != 2 || g2.GPUs != 16 || g2.IdleGPUs != 14 || g2.IdleGPUNodes != 2 || g2.FreeMilli != 14500 {
		t.Errorf("G2: %d nodes, %d GPUs, %d idle on %d nodes, %d milli free; want 2, 16, 14 on 2, 14500",
			g2.Nodes, g2.GPUs, g2.IdleGPUs, g2.IdleGPUNodes, g2.FreeMilli)
	}
	if g2.CPUMilli != 192000 || g2.CPULeft != 182000 || g2.CPULeftOnIdle != 182000 {
		t.Errorf("G2: CPU %d, left %d, left on nodes with idle GPUs %d; want 192000, 182000, 182000", g2.CPUMilli, g2.CPULeft, g2.CPULeftOnIdle)
	}
	if g2.Taken[takerPinned] != (taken{GPUMilli: 500, CPUMilli: 2000}) || g2.Taken[takerFree] != (taken{GPUMilli: 1000, CPUMilli: 8000}) || g2.Taken[takerCPU] != (taken{}) {
		t.Errorf("G2 taken %+v: want 500 milli GPU and 2000 m CPU pinned, 1000 and 8000 by the task that may run anywhere, none by CPU-only tasks", g2.Taken)
	}
	if g3 := rows[1]; g3.IdleGPUs != 8 || g3.CPULeftOnIdle != 112000 || g3.Taken[takerCPU].CPUMilli != 16000 {
		t.Errorf("G3: %d idle GPUs, %d m CPU left on them, %d m taken by CPU-only tasks; want 8, 112000, 16000", g3.IdleGPUs, g3.CPULeftOnIdle, g3.Taken[takerCPU].CPUMilli)
	}
	if none := rows[2]; none.Nodes != 1 || none.GPUs != 0 || none.FreeMilli != 0 || none.CPULeft != 60000 || none.Taken[takerCPU].CPUMilli != 4000 {
		t.Errorf("nodes without GPUs: %+v; want 1 node, no GPU, 60000 m CPU left, 4000 taken by CPU-only tasks", none)
	}
	if cols, want := len(strings.Split(g2.row(), "\t")), len(strings.Split(EndStateHeader, "\t")); cols != want {
		t.Errorf("row has %d columns, header %d", cols, want)
	}
}

// Replay writes each replay's end state when Options.EndState is set,
// without changing the replay: the GPU the log shows unallocated is the
// capacity less what the replay's last step counts allocated.
func TestReplayWritesEndState(t *testing.T) {
	nodes := []Node{{Name: "a", CPUMilli: 8000, MemoryMiB: 1 << 14, GPUs: 2, Model: "T4"}, {Name: "b", CPUMilli: 4000, MemoryMiB: 1 << 14, GPUs: 1, Model: "P100"}}
	tasks := []Task{{Name: "big", GPUs: 2, GPUMilli: 1000, CPUMilli: 6000}, {Name: "share", GPUs: 1, GPUMilli: 300, CPUMilli: 1000}}
	tr := &Trace{Nodes: nodes, Tasks: tasks, List: "t"}
	opt := Options{TopologyDir: testTopologies, Seeds: []uint64{1, 2}, Policies: []string{PolicyFirstFit, PolicyFGD}, MaxPercent: 300}
	plain, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	opt.EndState = &log
	logged, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	free := map[string]int64{} // seed/policy -> free milli over its lines
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 2*2*2 {
		t.Fatalf("%d lines, want one per model (2) for each seed (2) and policy (2):\n%s", len(lines), log.String())
	}
	col := map[string]int{}
	for i, name := range strings.Split(EndStateHeader, "\t") {
		col[name] = i
	}
	for _, l := range lines {
		f := strings.Split(l, "\t")
		if f[col["list"]] != "t" || (f[col["model"]] != "T4" && f[col["model"]] != "P100") {
			t.Errorf("line %q: want list t, model T4 or P100", l)
		}
		m, err := strconv.ParseInt(f[col["free_gpu_milli"]], 10, 64)
		if err != nil {
			t.Fatalf("line %q: free_gpu_milli: %v", l, err)
		}
		free[f[col["seed"]]+"/"+f[col["policy"]]] += m
	}
	for i, run := range plain.Runs {
		if got := logged.Runs[i].Steps; got[len(got)-1] != run.Steps[len(run.Steps)-1] {
			t.Errorf("the log changed the replay of seed %d, %s", run.Seed, run.Policy)
		}
		last := run.Steps[len(run.Steps)-1]
		want := run.Capacity - (last.Arrived - last.Failed)
		if got := free[strconv.FormatUint(run.Seed, 10)+"/"+run.Policy]; got != want {
			t.Errorf("seed %d, %s: %d milli GPU unallocated in the log, want capacity %d less %d allocated",
				run.Seed, run.Policy, got, run.Capacity, last.Arrived-last.Failed)
		}
	}
}
