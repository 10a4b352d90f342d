package tracebench

import (
	"fmt"
	"strings"
)

// Why a task failed: `gpulink simulate --trace --failures FILE` writes one
// line per task a policy could not place (Options.Failures), with the
// state of the nodes the task may run on at that moment, so that a policy
// leaving more GPU unallocated than another can be explained task by task
// (which tasks, short of what, and who took the capacity they needed)
// instead of by ad-hoc prints.

// taker is who placed work on a node, for the failure log's accounting.
type taker int

const (
	// takerPinned: a GPU task with gpu_spec (pinned to GPU models).
	takerPinned taker = iota
	// takerFree: a GPU task that may run on any model.
	takerFree
	// takerCPU: a task without GPUs.
	takerCPU
	takers
)

func takerOf(t *Task) taker {
	switch {
	case t.GPUs == 0:
		return takerCPU
	case len(t.Models) > 0:
		return takerPinned
	}
	return takerFree
}

// taken is what one kind of task took of a node: milli GPU and milli CPU.
type taken struct {
	GPUMilli, CPUMilli int64
}

// addTaken adds what each kind of task took of a node to a sum over
// nodes.
func addTaken(sum, node *[takers]taken) {
	for k := range sum {
		sum[k].GPUMilli += node[k].GPUMilli
		sum[k].CPUMilli += node[k].CPUMilli
	}
}

// FailureHeader is the first line of the failure log: tab-separated
// columns, one row per failed task (FailureRecord.row).
const FailureHeader = "list\tseed\tpolicy\tindex\tarrived_pct\ttask\tgpus\tgpu_milli\tcpu_milli\tmemory_mib\tmodels\t" +
	"reason\tnodes\tgpu_fit\tgpu_cpu_fit\tgpu_mem_fit\tidle_gpus\tfree_milli\tcpu_left\tmax_cpu_left_gpu_fit\t" +
	"gpu_pinned\tgpu_free\tcpu_pinned\tcpu_free\tcpu_cpuonly\tbest_node\tbest_cpu_pinned\tbest_cpu_free\tbest_cpu_cpuonly"

// FailureRecord is one failed task and the state, when it failed, of the
// nodes whose model it admits (its gpu_spec; every GPU node when it has
// none; every node for a CPU-only task).
type FailureRecord struct {
	List, Policy string
	Seed         uint64
	// Index is the task's position in the seed's arrival sequence (the
	// same task under every policy); ArrivedPct the GPU requests arrived
	// by then, in % of capacity.
	Index      int
	ArrivedPct float64
	Task       *Task
	// Reason: "gpus" when no admitted node has the GPUs free (whole) or
	// a GPU with the share left, "cpu", "memory" or "cpu+memory" when
	// some do and all of those are short of that, "none" when a node
	// fits (the policy missed it: a defect).
	Reason string
	// Nodes admitted; GPUFit of them with the GPUs; GPUCPUFit and
	// GPUMemFit those with the GPUs and the CPU, and with the GPUs and
	// the memory.
	Nodes, GPUFit, GPUCPUFit, GPUMemFit int
	// IdleGPUs (whole, unshared) and FreeMilli (all unallocated GPU) on
	// the admitted nodes; CPULeft their CPU left; MaxCPULeftGPUFit the
	// most CPU left on a node with the GPUs.
	IdleGPUs           int
	FreeMilli, CPULeft int64
	MaxCPULeftGPUFit   int64
	// Taken is what each kind of task took of the admitted nodes.
	Taken [takers]taken
	// Best is the admitted node with the GPUs and the most CPU left
	// ("" when none has the GPUs), BestTaken what each kind of task
	// took of it: who made it short.
	Best      string
	BestTaken [takers]taken
}

func (r *FailureRecord) row() string {
	t := r.Task
	return fmt.Sprintf("%s\t%d\t%s\t%d\t%.2f\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d",
		r.List, r.Seed, r.Policy, r.Index, r.ArrivedPct, t.Name, t.GPUs, t.GPUMilli, t.CPUMilli, t.MemoryMiB,
		cmpOr(strings.Join(t.Models, "|"), "-"), r.Reason, r.Nodes, r.GPUFit, r.GPUCPUFit, r.GPUMemFit,
		r.IdleGPUs, r.FreeMilli, r.CPULeft, r.MaxCPULeftGPUFit,
		r.Taken[takerPinned].GPUMilli, r.Taken[takerFree].GPUMilli,
		r.Taken[takerPinned].CPUMilli, r.Taken[takerFree].CPUMilli, r.Taken[takerCPU].CPUMilli,
		cmpOr(r.Best, "-"), r.BestTaken[takerPinned].CPUMilli, r.BestTaken[takerFree].CPUMilli, r.BestTaken[takerCPU].CPUMilli)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// describeFailure is the record of t failing on c now.
func describeFailure(c *Cluster, t *Task) FailureRecord {
	r := FailureRecord{Task: t}
	for _, n := range c.nodes {
		if t.GPUs > 0 && (n.kind == nil || !t.Accepts(n.spec.Model)) {
			continue
		}
		r.Nodes++
		r.IdleGPUs += n.freeGPUs()
		r.FreeMilli += n.leftTotal()
		r.CPULeft += n.cpuLeft
		addTaken(&r.Taken, &n.taken)
		if !n.gpusFit(t) {
			continue
		}
		if r.GPUFit == 0 || n.cpuLeft > r.MaxCPULeftGPUFit {
			r.MaxCPULeftGPUFit, r.Best, r.BestTaken = n.cpuLeft, n.spec.Name, n.taken
		}
		r.GPUFit++
		if t.CPUMilli <= n.cpuLeft {
			r.GPUCPUFit++
		}
		if t.MemoryMiB <= n.memLeft {
			r.GPUMemFit++
		}
	}
	switch {
	case r.GPUFit == 0:
		r.Reason = "gpus"
	case r.GPUCPUFit == 0 && r.GPUMemFit == 0:
		r.Reason = "cpu+memory"
	case r.GPUCPUFit == 0:
		r.Reason = "cpu"
	case r.GPUMemFit == 0:
		r.Reason = "memory"
	default:
		// Some node has the GPUs, CPU and memory apart: short of both
		// only together, or the policy missed a fitting node.
		r.Reason = "cpu|memory"
		for _, n := range c.nodes {
			if n.fits(t) {
				r.Reason = "none"
				break
			}
		}
	}
	return r
}
