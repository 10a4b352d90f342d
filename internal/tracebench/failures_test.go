package tracebench

import (
	"strings"
	"testing"
)

// The failure log says why a task found no node and who took what it
// needed: the 8-GPU 120-core task of FGD's trace on a G3 node of which a
// CPU-only task took 16 cores (as the pods without GPUs did under the
// chart's defaults, docs/performance/trace.md), beside a G2 node too
// small for it.
func TestDescribeFailure(t *testing.T) {
	c := testCluster(t,
		Node{CPUMilli: 128000, MemoryMiB: 768 << 10, GPUs: 8, Model: "G3"},
		Node{CPUMilli: 96000, MemoryMiB: 384 << 10, GPUs: 8, Model: "G2"})
	use(t, c, 0, 16000)
	use(t, c, 1, 8000, 1000)
	if err := c.apply(&Task{Name: "pinned", GPUs: 1, GPUMilli: 500, CPUMilli: 2000, Models: []string{"G2"}}, Placement{Node: 1, GPUs: []int{1}}); err != nil {
		t.Fatal(err)
	}
	whole := &Task{Name: "whole", GPUs: 8, GPUMilli: 1000, CPUMilli: 120000, MemoryMiB: 720 << 10}
	r := describeFailure(c, whole)
	if r.Reason != "cpu" || r.Nodes != 2 || r.GPUFit != 1 || r.GPUCPUFit != 0 || r.GPUMemFit != 1 {
		t.Errorf("got reason %q, %d nodes, %d with the GPUs, %d of them with the CPU, %d with the memory; want cpu, 2, 1, 0, 1",
			r.Reason, r.Nodes, r.GPUFit, r.GPUCPUFit, r.GPUMemFit)
	}
	if r.Best != "n0" || r.MaxCPULeftGPUFit != 112000 || r.BestTaken[takerCPU].CPUMilli != 16000 || r.BestTaken[takerFree].CPUMilli != 0 {
		t.Errorf("best node %s with %d m CPU left, taken %+v; want n0 with 112000, 16000 m by CPU-only tasks", r.Best, r.MaxCPULeftGPUFit, r.BestTaken)
	}
	if r.IdleGPUs != 14 || r.FreeMilli != 14500 {
		t.Errorf("idle GPUs %d, free milli %d; want 14 and 14500", r.IdleGPUs, r.FreeMilli)
	}
	if got := r.Taken[takerPinned]; got != (taken{GPUMilli: 500, CPUMilli: 2000}) {
		t.Errorf("taken by pinned tasks %+v, want 500 milli GPU, 2000 m CPU", got)
	}
	// Pinned to G2: only node 1 is admitted; it has 6 idle GPUs.
	r = describeFailure(c, &Task{Name: "g2", GPUs: 8, GPUMilli: 1000, CPUMilli: 1000, Models: []string{"G2"}})
	if r.Reason != "gpus" || r.Nodes != 1 || r.Best != "" {
		t.Errorf("pinned 8-GPU task: reason %q, %d nodes, best %q; want gpus, 1, none", r.Reason, r.Nodes, r.Best)
	}
	row := strings.Split(r.row(), "\t")
	if want := len(strings.Split(FailureHeader, "\t")); len(row) != want {
		t.Errorf("row has %d columns, header %d", len(row), want)
	}
}

// Replay writes one line per failed task when Options.Failures is set,
// and none otherwise changes: the replay's figures are the same.
func TestReplayWritesFailures(t *testing.T) {
	nodes := []Node{{Name: "a", CPUMilli: 8000, MemoryMiB: 1 << 14, GPUs: 2, Model: "T4"}}
	tasks := []Task{{Name: "big", GPUs: 2, GPUMilli: 1000, CPUMilli: 6000}, {Name: "small", GPUs: 1, GPUMilli: 1000, CPUMilli: 1000}}
	tr := &Trace{Nodes: nodes, Tasks: tasks, List: "t"}
	var log strings.Builder
	opt := Options{TopologyDir: testTopologies, Seeds: []uint64{1}, Policies: []string{PolicyFirstFit}, MaxPercent: 300}
	plain, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	opt.Failures = &log
	logged, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	last := plain.Runs[0].Steps[len(plain.Runs[0].Steps)-1]
	if len(lines) != last.FailedTasks || last.FailedTasks == 0 {
		t.Fatalf("%d lines logged, %d tasks failed: %q", len(lines), last.FailedTasks, log.String())
	}
	if got := logged.Runs[0].Steps; len(got) != len(plain.Runs[0].Steps) || got[len(got)-1] != last {
		t.Errorf("the log changed the replay: %+v, want %+v", got[len(got)-1], last)
	}
	for _, l := range lines {
		if f := strings.Split(l, "\t"); f[0] != "t" || f[2] != PolicyFirstFit {
			t.Errorf("line %q: want list t, policy %s", l, PolicyFirstFit)
		}
	}
}
