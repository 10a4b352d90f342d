package tracebench

import (
	"fmt"
	"io"
	"slices"
)

// PolicyGpulinkTaint is the chart's defaults on a cluster whose GPU nodes
// carry a taint only GPU pods tolerate (docs/cpu-pods.md): the CPU-only
// tasks never reach the replay's nodes, which are all GPU nodes, and run
// on CPU nodes outside it. Its unallocated GPUs are therefore what the GPU
// tasks alone leave; its cost is the CPU nodes the CPU-only tasks need
// instead, which OffGPUDemand measures (not counted in the unallocated
// GPUs: a CPU-only task asks for none).
const PolicyGpulinkTaint = "gpulink+taint-gpu-nodes"

// offGPUNodes is where tainting GPU nodes puts a CPU-only task: on no node
// of the replayed (GPU) cluster. The replay counts it among the tasks not
// placed, which no GPU figure includes.
func offGPUNodes(*Cluster, *Task) (Placement, bool, error) { return Placement{}, false, nil }

// OffGPUStep is what the CPU-only tasks drawn by one arrival step ask
// for, mean over the seeds: what tainting the GPU nodes moves to CPU
// nodes.
type OffGPUStep struct {
	Percent int
	// Tasks, CPUMilli and MemoryMiB: the CPU-only tasks drawn so far, and
	// their CPU and memory requests.
	Tasks               float64
	CPUMilli, MemoryMiB float64
}

// OffGPUDemand replays the arrival sequences of Replay (same seeds, node
// stride and steps) and sums the CPU-only tasks' requests at each step.
func OffGPUDemand(tr *Trace, opt Options) ([]OffGPUStep, error) {
	opt.defaults()
	var capMilli int64
	for i := 0; i < len(tr.Nodes); i += opt.NodeStride {
		capMilli += int64(tr.Nodes[i].GPUs) * MilliPerGPU
	}
	if capMilli == 0 {
		return nil, fmt.Errorf("trace %s: the nodes have no GPUs", tr.List)
	}
	if len(opt.Seeds) == 0 {
		return nil, fmt.Errorf("trace %s: no seeds", tr.List)
	}
	var steps []OffGPUStep
	for p := opt.StepPercent; p <= opt.MaxPercent; p += opt.StepPercent {
		steps = append(steps, OffGPUStep{Percent: p})
	}
	limit := capMilli * int64(opt.MaxPercent) / 100
	n := float64(len(opt.Seeds))
	for _, seed := range opt.Seeds {
		var arrived, cpu, mem int64
		tasks, next := 0, 0
		for _, ti := range sequence(tr.Tasks, limit, seed, tr.List) {
			t := &tr.Tasks[ti]
			arrived += t.TotalMilli()
			if t.GPUs == 0 {
				tasks++
				cpu += t.CPUMilli
				mem += t.MemoryMiB
			}
			for next < len(steps) && arrived*100 >= capMilli*int64(steps[next].Percent) {
				steps[next].Tasks += float64(tasks) / n
				steps[next].CPUMilli += float64(cpu) / n
				steps[next].MemoryMiB += float64(mem) / n
				next++
			}
		}
	}
	return steps, nil
}

// WriteOffGPUDemand writes, per list, the CPU and memory the CPU-only
// tasks take off the GPU nodes at each step from minPercent on, also in
// nodes of the replayed cluster's mean CPU and memory.
func WriteOffGPUDemand(w io.Writer, tr *Trace, steps []OffGPUStep, opt Options, minPercent int) error {
	opt.defaults()
	var cpu, mem float64
	var nodes int
	for i := 0; i < len(tr.Nodes); i += opt.NodeStride {
		cpu += float64(tr.Nodes[i].CPUMilli)
		mem += float64(tr.Nodes[i].MemoryMiB)
		nodes++
	}
	if nodes == 0 || cpu == 0 || mem == 0 {
		return fmt.Errorf("trace %s: no node CPU or memory to compare with", tr.List)
	}
	cpu, mem = cpu/float64(nodes), mem/float64(nodes)
	_, err := fmt.Fprintf(w, "\n`%s` on %s: the CPU-only tasks run on CPU nodes instead (mean over seeds; in nodes of the replayed cluster's mean size, %.0f cores and %.0f GiB):\n\n"+
		"| arrived | CPU-only tasks | cores | memory (GiB) | nodes by CPU | nodes by memory |\n|---|---|---|---|---|---|\n",
		PolicyGpulinkTaint, tr.List, cpu/1000, mem/1024)
	if err != nil {
		return err
	}
	for _, s := range steps {
		if s.Percent < minPercent {
			continue
		}
		if _, err := fmt.Fprintf(w, "| %d %% | %.0f | %.0f | %.0f | %.1f | %.1f |\n", s.Percent, s.Tasks, s.CPUMilli/1000, s.MemoryMiB/1024, s.CPUMilli/cpu, s.MemoryMiB/mem); err != nil {
			return err
		}
	}
	return nil
}

// HasTaintRow tells whether the options replay PolicyGpulinkTaint (all
// policies when none are named).
func HasTaintRow(opt Options) bool {
	opt.defaults()
	return slices.Contains(opt.Policies, PolicyGpulinkTaint)
}
