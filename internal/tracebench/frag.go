package tracebench

import (
	"slices"
	"strings"
)

// Fragmentation as FGD defines it (Weng et al., ATC '23, §3): given a
// target workload M of task classes m with popularity p_m, the fragment
// of node n for task m is
//
//	F_n(m) = all of n's unallocated GPU      if m cannot run on n (short of
//	                                         CPU, memory, GPUs, or a
//	                                         model gpu_spec excludes)
//	F_n(m) = sum of unallocated GPU of the   otherwise
//	         GPUs whose unallocated part is
//	         less than m's per-GPU demand
//
// and F_n(M) = sum_m p_m F_n(m). The cluster's fragmentation is the sum
// over nodes, and the fragmentation rate is that sum over the cluster's
// unallocated GPU (sum_m p_m = 1, so a node whose every GPU is useless
// to every class is 100 % fragmented). The paper's simulator checks CPU
// only; the replay models memory as well, and a task short of memory is
// one that cannot run. M is the GPU tasks of the trace list grouped by
// identical demand; CPU-only tasks leave no GPU fragment of their own and
// are not in M (as in the paper's artifact).

// taskClass is one kind of GPU task in M.
type taskClass struct {
	cpu, mem int64
	gpus     int
	milli    int32
	models   []string
	count    int64 // tasks of the class: p_m = count/total
}

// Workload is the target workload M.
type Workload struct {
	classes []taskClass
	total   int64
	access  map[string][]bool // per node model: which classes may run there
}

// NewWorkload builds M from a task list.
func NewWorkload(tasks []Task) *Workload {
	idx := map[string]int{}
	w := &Workload{access: map[string][]bool{}}
	for i := range tasks {
		t := &tasks[i]
		if t.GPUs == 0 {
			continue
		}
		key := strings.Join([]string{itoa(t.CPUMilli), itoa(t.MemoryMiB), itoa(int64(t.GPUs)), itoa(int64(t.GPUMilli)), strings.Join(t.Models, "|")}, ",")
		j, ok := idx[key]
		if !ok {
			j = len(w.classes)
			idx[key] = j
			w.classes = append(w.classes, taskClass{cpu: t.CPUMilli, mem: t.MemoryMiB, gpus: t.GPUs, milli: int32(t.GPUMilli), models: t.Models})
		}
		w.classes[j].count++
		w.total++
	}
	// Largest classes first: only the order of a sum changes, and the
	// order is fixed, so results do not depend on map iteration.
	slices.SortStableFunc(w.classes, func(a, b taskClass) int { return int(b.count - a.count) })
	return w
}

func itoa(v int64) string {
	var b [20]byte
	i := len(b)
	neg := v < 0
	if neg {
		v = -v
	}
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Classes is the number of task classes in M.
func (w *Workload) Classes() int { return len(w.classes) }

func (w *Workload) accessFor(model string) []bool {
	if a, ok := w.access[model]; ok {
		return a
	}
	a := make([]bool, len(w.classes))
	for i := range w.classes {
		t := Task{Models: w.classes[i].models}
		a[i] = t.Accepts(model)
	}
	w.access[model] = a
	return a
}

// fragScaled is F_n(M) times the workload's task count (an integer, so
// that policies compare fragments exactly): divide by w.total for milli
// GPUs.
func (w *Workload) fragScaled(access []bool, cpuLeft, memLeft int64, left []int32) int64 {
	var all int64
	for _, l := range left {
		all += int64(l)
	}
	if all == 0 {
		return 0
	}
	var f int64
	for i := range w.classes {
		m := &w.classes[i]
		if !access[i] || m.cpu > cpuLeft || m.mem > memLeft {
			f += m.count * all
			continue
		}
		fit, small := 0, int64(0)
		for _, l := range left {
			if l >= m.milli {
				fit++
			} else {
				small += int64(l)
			}
		}
		if fit < m.gpus {
			f += m.count * all
		} else {
			f += m.count * small
		}
	}
	return f
}

// nodeFrag is F_n(M) of a node in its current state (scaled), cached.
func (w *Workload) nodeFrag(n *nodeState) int64 {
	if n.kind == nil {
		return 0
	}
	if !n.fragOK {
		n.frag = w.fragScaled(w.accessFor(n.spec.Model), n.cpuLeft, n.memLeft, n.left)
		n.fragOK = true
	}
	return n.frag
}

// clusterFrag returns the cluster's fragmentation and unallocated GPU,
// both in milli GPUs.
func (w *Workload) clusterFrag(c *Cluster) (frag float64, idle int64) {
	var s int64
	for _, n := range c.nodes {
		s += w.nodeFrag(n)
		idle += n.leftTotal()
	}
	if w.total == 0 {
		return 0, idle
	}
	return float64(s) / float64(w.total), idle
}
