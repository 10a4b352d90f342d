package tracebench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sync"
)

// Where the unallocated GPU is at the end: `gpulink simulate --trace
// --end-state FILE` writes, for every replay (list, seed, policy), one
// line per GPU model with what is left on its nodes once every task has
// arrived, and what each kind of task took of them (Options.EndState).
// Two policies that end with different unallocated GPU can then be told
// apart by model (which nodes hold the difference, whole GPUs or pieces,
// short of CPU or not), where the analyses of docs/performance/trace.md
// wrote a throwaway dump of the cluster several times.

// EndStateHeader is the first line of the end-state log: tab-separated
// columns, one row per GPU model and replay (EndStateRow.row). Milli
// columns are milli GPU or milli CPU.
const EndStateHeader = "list\tseed\tpolicy\tmodel\tnodes\tgpus\tidle_gpus\tidle_gpu_nodes\tcpu_left_on_idle_gpu_nodes\t" +
	"free_gpu_milli\tcpu_milli\tcpu_left\tgpu_pinned\tgpu_free\tcpu_pinned\tcpu_free\tcpu_cpuonly"

// noGPUModel names the nodes without GPUs in the end-state log.
const noGPUModel = "-"

// EndStateRow is the end state of one GPU model's nodes in one replay.
type EndStateRow struct {
	List, Policy, Model string
	Seed                uint64
	// Nodes of the model and their GPUs.
	Nodes, GPUs int
	// IdleGPUs are whole GPUs with nothing on them, on IdleGPUNodes
	// nodes, which have CPULeftOnIdle milli CPU left between them: GPUs
	// no arriving task could use for want of CPU show as idle GPUs on
	// nodes with little CPU left.
	IdleGPUs, IdleGPUNodes int
	CPULeftOnIdle          int64
	// FreeMilli is all unallocated GPU, pieces of shared GPUs included.
	FreeMilli int64
	// CPUMilli is the nodes' CPU, CPULeft what is left of it.
	CPUMilli, CPULeft int64
	// Taken is what each kind of task took of the nodes.
	Taken [takers]taken
}

func (r *EndStateRow) row() string {
	return fmt.Sprintf("%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d",
		r.List, r.Seed, r.Policy, r.Model, r.Nodes, r.GPUs, r.IdleGPUs, r.IdleGPUNodes, r.CPULeftOnIdle,
		r.FreeMilli, r.CPUMilli, r.CPULeft,
		r.Taken[takerPinned].GPUMilli, r.Taken[takerFree].GPUMilli,
		r.Taken[takerPinned].CPUMilli, r.Taken[takerFree].CPUMilli, r.Taken[takerCPU].CPUMilli)
}

// endState is c's state by GPU model, models in name order (the nodes
// without GPUs last, as noGPUModel).
func endState(c *Cluster) []EndStateRow {
	byModel := map[string]*EndStateRow{}
	for _, n := range c.nodes {
		model := n.spec.Model
		if n.kind == nil {
			model = noGPUModel
		}
		r := byModel[model]
		if r == nil {
			r = &EndStateRow{Model: model}
			byModel[model] = r
		}
		r.Nodes++
		r.CPUMilli += n.spec.CPUMilli
		r.CPULeft += n.cpuLeft
		addTaken(&r.Taken, &n.taken)
		if n.kind == nil {
			continue
		}
		r.GPUs += len(n.left)
		r.FreeMilli += n.leftTotal()
		if idle := n.freeGPUs(); idle > 0 {
			r.IdleGPUs += idle
			r.IdleGPUNodes++
			r.CPULeftOnIdle += n.cpuLeft
		}
	}
	rows := make([]EndStateRow, 0, len(byModel))
	for _, r := range byModel {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b EndStateRow) int {
		// false sorts before true: the nodes without GPUs go last.
		noA, noB := a.Model == noGPUModel, b.Model == noGPUModel
		if noA != noB {
			return cmp.Compare(b2i(noA), b2i(noB))
		}
		return cmp.Compare(a.Model, b.Model)
	})
	return rows
}

// tsvLog writes lines from parallel replays, whole: the failure log and
// the end-state log. The first write error is kept and later writes are
// dropped.
type tsvLog struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func newTSVLog(w io.Writer) *tsvLog {
	if w == nil {
		return nil
	}
	return &tsvLog{w: w}
}

func (l *tsvLog) write(lines ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range lines {
		if l.err != nil {
			return
		}
		_, l.err = io.WriteString(l.w, line+"\n")
	}
}

// failed is the log's first write error, with what the log is; nil for
// no log.
func (l *tsvLog) failed(what string) error {
	if l == nil || l.err == nil {
		return nil
	}
	return fmt.Errorf("write the %s: %w", what, l.err)
}
