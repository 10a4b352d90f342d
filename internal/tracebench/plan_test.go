package tracebench

import (
	"slices"
	"testing"
)

// The plan is Replay's run: the kept nodes, their topologies named after
// the model with the nominal memory, and the task sequence whose GPU
// requests add up to what the run's last step says arrived.
func TestReplayPlanIsTheReplaysRun(t *testing.T) {
	tr := synthTrace()
	opt := Options{TopologyDir: testTopologies, Seeds: []uint64{3}, NodeStride: 3, Policies: []string{PolicyFirstFit}}
	res, err := Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewReplayPlan(tr, opt, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Nodes) != res.Nodes || p.CapacityMilli != res.Runs[0].Capacity {
		t.Fatalf("plan: %d nodes, capacity %d; replay: %d nodes, capacity %d", len(p.Nodes), p.CapacityMilli, res.Nodes, res.Runs[0].Capacity)
	}
	for i, n := range p.Nodes {
		if n.Name != tr.Nodes[i*3].Name {
			t.Errorf("plan node %d is %s, want %s (every 3rd)", i, n.Name, tr.Nodes[i*3].Name)
		}
		if n.GPUs > 0 && (n.Topology == nil || n.Topology.Len() != n.GPUs || n.Topology.GPUs[0].ProductName != n.Model || n.Topology.GPUs[0].MemoryBytes != NominalGPUMemory) {
			t.Errorf("plan node %s: topology %+v, want %d GPUs of %s with the nominal memory", n.Name, n.Topology, n.GPUs, n.Model)
		}
	}
	var arrived int64
	for _, task := range p.Tasks {
		arrived += task.TotalMilli()
	}
	steps := res.Runs[0].Steps
	if last := steps[len(steps)-1]; last.Arrived != arrived || res.Runs[0].Tasks != len(p.Tasks) {
		t.Fatalf("plan: %d tasks, %d milli GPU arrived; replay: %d tasks, %d", len(p.Tasks), arrived, res.Runs[0].Tasks, last.Arrived)
	}
	other, err := NewReplayPlan(tr, opt, 4)
	if err != nil {
		t.Fatal(err)
	}
	if slices.EqualFunc(p.Tasks, other.Tasks, func(a, b Task) bool { return a.Name == b.Name }) {
		t.Error("seeds 3 and 4 planned the same tasks")
	}
}
