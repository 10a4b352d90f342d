package tracebench

import (
	"strings"
	"testing"
)

// The taint row places no CPU-only task on the (GPU) nodes and every GPU
// task the default row places; OffGPUDemand counts exactly the CPU-only
// tasks of the replay's arrival sequences, growing with the steps.
func TestTaintRowKeepsCPUOnlyTasksOffGPUNodes(t *testing.T) {
	tr := synthTrace()
	opt := Options{TopologyDir: testTopologies, Seeds: []uint64{1, 2}, Policies: []string{PolicyGpulinkTaint}, MaxPercent: 100}
	res, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	steps, err := OffGPUDemand(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != len(res.StepPercents()) {
		t.Fatalf("%d demand steps, %d replay steps", len(steps), len(res.StepPercents()))
	}
	for _, run := range res.Runs {
		// Count the CPU-only tasks of this seed's sequence by hand.
		var cpuOnly int
		var cpu int64
		for _, ti := range sequence(tr.Tasks, run.Capacity*100/100, run.Seed, tr.List) {
			if tr.Tasks[ti].GPUs == 0 {
				cpuOnly++
				cpu += tr.Tasks[ti].CPUMilli
			}
		}
		if cpuOnly == 0 {
			t.Fatalf("seed %d: no CPU-only task drawn; the test needs some", run.Seed)
		}
		last := run.Steps[len(run.Steps)-1]
		// CPU-only tasks are the replay's failures here: they are on no
		// GPU node. GPU tasks that failed would only add to them.
		if last.FailedTasks < cpuOnly {
			t.Errorf("seed %d: %d tasks not placed on GPU nodes, want at least the %d CPU-only ones", run.Seed, last.FailedTasks, cpuOnly)
		}
	}
	for i := 1; i < len(steps); i++ {
		if steps[i].CPUMilli < steps[i-1].CPUMilli || steps[i].Tasks < steps[i-1].Tasks {
			t.Errorf("step %d %% asks less than step %d %%: %+v < %+v", steps[i].Percent, steps[i-1].Percent, steps[i], steps[i-1])
		}
	}
	if steps[len(steps)-1].Tasks == 0 || steps[len(steps)-1].CPUMilli == 0 {
		t.Errorf("no CPU-only demand at 100 %%: %+v", steps[len(steps)-1])
	}
	var b strings.Builder
	if err := WriteOffGPUDemand(&b, tr, steps, opt, 70); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| 100 % |") || strings.Contains(b.String(), "| 60 % |") {
		t.Errorf("table does not list 70-100 %% only:\n%s", b.String())
	}
}
