package tracebench

import (
	"fmt"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// nodeState is one node during a replay.
type nodeState struct {
	spec    *Node
	kind    *kind
	cpuLeft int64
	memLeft int64
	// left is each GPU's unallocated milli GPU (1000 = free), by
	// position in kind.topo.
	left []int32
	// classes counts the GPU tasks on the node by (GPUs, milli), for
	// GPU clustering.
	classes map[[2]int]int
	// alloc is the node as gpulink's allocator sees it, kept in step
	// with left, cpuLeft and memLeft whatever policy placed the work
	// (Topology nil on a node without GPUs).
	alloc *allocate.NodeState
	// frag caches the node's fragmentation (frag.go); fragOK is false
	// after a change.
	frag   int64
	fragOK bool
	// changes counts the tasks placed on the node, so that what is
	// derived from its state (the steering taint, steer.go) is computed
	// again only after a change.
	changes uint64
	// taken is what each kind of task took of the node (failures.go).
	taken [takers]taken
}

func (n *nodeState) freeGPUs() int {
	c := 0
	for _, l := range n.left {
		if l == MilliPerGPU {
			c++
		}
	}
	return c
}

func (n *nodeState) leftTotal() int64 {
	var s int64
	for _, l := range n.left {
		s += int64(l)
	}
	return s
}

// fits is the filter every policy applies, as kube-scheduler's and
// gpulink's: the task's CPU and memory fit what is left, its gpu_spec
// admits the node's model, and there are enough free GPUs (whole) or a
// GPU with the share left (share).
func (n *nodeState) fits(t *Task) bool {
	if t.CPUMilli > n.cpuLeft || t.MemoryMiB > n.memLeft {
		return false
	}
	return n.gpusFit(t)
}

// gpusFit is fits without CPU and memory: the task's gpu_spec admits the
// node's model and it has the GPUs free (whole) or a GPU with the share
// left (share); always true for a task without GPUs.
func (n *nodeState) gpusFit(t *Task) bool {
	if t.GPUs == 0 {
		return true
	}
	if n.kind == nil || !t.Accepts(n.spec.Model) {
		return false
	}
	if t.Share() {
		for _, l := range n.left {
			if int(l) >= t.GPUMilli {
				return true
			}
		}
		return false
	}
	return n.freeGPUs() >= t.GPUs
}

// Cluster is the replayed cluster.
type Cluster struct {
	nodes    []*nodeState
	capMilli int64 // GPU capacity in milli GPUs
	maxCPU   int64 // largest node's CPU, memory and GPUs (best-fit's scale)
	maxMem   int64
	maxGPUs  int
}

// newCluster builds an idle cluster; kinds maps node models to topologies.
func newCluster(nodes []Node, ks *kindSet) (*Cluster, error) {
	c := &Cluster{}
	for i := range nodes {
		sp := &nodes[i]
		n := &nodeState{spec: sp, cpuLeft: sp.CPUMilli, memLeft: sp.MemoryMiB, classes: map[[2]int]int{},
			alloc: &allocate.NodeState{Name: sp.Name}}
		if sp.GPUs > 0 {
			k, err := ks.get(sp.Model, sp.GPUs)
			if err != nil {
				return nil, fmt.Errorf("node %s: %w", sp.Name, err)
			}
			n.kind = k
			n.left = make([]int32, sp.GPUs)
			for p := range n.left {
				n.left[p] = MilliPerGPU
			}
			n.alloc = &allocate.NodeState{Name: sp.Name, Topology: k.topo, Usage: make([]allocate.GPUUsage, sp.GPUs),
				MaxSharesPerGPU: MilliPerGPU / shareGranularity}
		}
		n.alloc.Host = &allocate.Host{CPUMilli: n.cpuLeft, MemoryBytes: n.memLeft << 20}
		c.nodes = append(c.nodes, n)
		c.capMilli += int64(sp.GPUs) * MilliPerGPU
		c.maxCPU = max(c.maxCPU, sp.CPUMilli)
		c.maxMem = max(c.maxMem, sp.MemoryMiB)
		c.maxGPUs = max(c.maxGPUs, sp.GPUs)
	}
	return c, nil
}

// Placement is a policy's choice: a node and the GPU positions (one for a
// share, none for a CPU-only task).
type Placement struct {
	Node int
	GPUs []int
}

// apply commits p for t, checking it against the filter so that no
// policy can place more than a node holds.
func (c *Cluster) apply(t *Task, p Placement) error {
	if p.Node < 0 || p.Node >= len(c.nodes) {
		return fmt.Errorf("placement on node %d of %d", p.Node, len(c.nodes))
	}
	n := c.nodes[p.Node]
	if !n.fits(t) {
		return fmt.Errorf("task %s does not fit node %s", t.Name, n.spec.Name)
	}
	want := t.GPUs
	if len(p.GPUs) != want {
		return fmt.Errorf("task %s: %d GPUs placed, wants %d", t.Name, len(p.GPUs), want)
	}
	seen := uint64(0)
	for _, g := range p.GPUs {
		if g < 0 || g >= len(n.left) || seen>>g&1 != 0 {
			return fmt.Errorf("task %s on %s: bad GPU position %d", t.Name, n.spec.Name, g)
		}
		seen |= 1 << g
		if int(n.left[g]) < t.GPUMilli {
			return fmt.Errorf("task %s on %s: GPU %d has %d milli left, wants %d", t.Name, n.spec.Name, g, n.left[g], t.GPUMilli)
		}
	}
	n.cpuLeft -= t.CPUMilli
	n.memLeft -= t.MemoryMiB
	n.alloc.Host = &allocate.Host{CPUMilli: n.cpuLeft, MemoryBytes: n.memLeft << 20}
	n.fragOK = false
	n.changes++
	who := &n.taken[takerOf(t)]
	who.CPUMilli += t.CPUMilli
	who.GPUMilli += t.TotalMilli()
	if t.GPUs == 0 {
		return nil
	}
	n.classes[[2]int{t.GPUs, t.GPUMilli}]++
	for _, g := range p.GPUs {
		n.left[g] -= int32(t.GPUMilli)
		u := &n.alloc.Usage[g]
		if t.Share() {
			u.Shares++
			u.MemoryBytes += int64(t.GPUMilli) * nominalShareUnit
			u.Cores += int64(t.GPUMilli / shareGranularity)
		} else {
			u.Exclusive = true
		}
	}
	return nil
}

// defaultGPUs is how the baselines pick GPUs inside the chosen node (the
// simulator of the FGD paper and the GPU-share scheduler extender it
// builds on): a share goes to the GPU with the least left that fits it
// (best fit), whole GPUs are the lowest-numbered free ones. Neither looks
// at links.
func defaultGPUs(n *nodeState, t *Task) []int {
	if t.GPUs == 0 {
		return nil
	}
	if t.Share() {
		best := -1
		for g, l := range n.left {
			if int(l) >= t.GPUMilli && (best < 0 || l < n.left[best]) {
				best = g
			}
		}
		return []int{best}
	}
	return lowestFree(n, t.GPUs)
}

func lowestFree(n *nodeState, k int) []int {
	out := make([]int, 0, k)
	for g, l := range n.left {
		if l == MilliPerGPU && len(out) < k {
			out = append(out, g)
		}
	}
	return out
}

// weakest is the weakest link of a placed set (LinkNone below 2 GPUs).
func weakest(n *nodeState, gpus []int) topology.Link {
	if len(gpus) < 2 {
		return topology.LinkNone
	}
	return n.kind.topo.WeakestLink(gpus)
}
