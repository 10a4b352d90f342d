package tracebench

import (
	"github.com/gpulink/gpulink/driver/allocate"
)

// Other conditions for the steering taints, measured against the chart's
// (steerScarce, in PolicyGpulink) and kept to reproduce the comparison
// (docs/performance/trace.md); the controller deploys none of them, and
// they are not in AllPolicies.
const (
	PolicySteerAnyFree     = "gpulink+steer-any-free"
	PolicySteerUsable      = "gpulink+steer-usable"
	PolicySteerWholeUsable = "gpulink+steer-whole-usable"
	PolicySteerIdleNode    = "gpulink+steer-idle-node"
)

// steerMode is which GPU nodes carry gpulink's PreferNoSchedule steering
// taint (docs/cpu-pods.md): the controller taints the GPU nodes whose
// GPUs are still worth keeping for GPU pods, so that kube-scheduler's
// TaintToleration score sends a pod without GPU claims (which tolerates
// none of it) to a node without the taint whenever one fits it.
type steerMode int

const (
	// steerOff: no taint (kube-scheduler's spreading alone).
	steerOff steerMode = iota
	// steerAnyFree: a node with any unallocated GPU, whole or the rest
	// of a shared one.
	steerAnyFree
	// steerWholeFree: a node with at least one whole unallocated GPU (a
	// GPU neither given out nor shared): the controller's first taint
	// (planner.Ledger.HasIdleGPU), alone with
	// controller.steerScarceNodes: false.
	steerWholeFree
	// steerUsable: a node whose unallocated GPU some shape of the recent
	// GPU pods (the demand mix) could still use, given the node's CPU,
	// memory, product and GPUs left (allocate.DemandMix.Usable): GPU
	// already stranded is not kept.
	steerUsable
	// steerWholeUsable: a node with a whole unallocated GPU that some
	// shape of the demand mix could still use (steerWholeFree and
	// steerUsable both).
	steerWholeUsable
	// steerIdleNode: steerWholeFree's taint, and a second one on a node
	// all of whose GPUs are idle.
	steerIdleNode
	// steerScarce: steerWholeFree's taint (also on a node without a whole
	// free GPU whose shared GPUs' rest a shape of the mix weighed at least
	// allocate.KeepScarceShares times could still use:
	// allocate.DemandMix.KeepForScarce, the controller's
	// planner.Planner.KeptForScarce), and a second one on a node
	// all of whose GPUs are idle and on which a scarce shape of the demand
	// mix weighed by scarcity could still run
	// (allocate.DemandMix.Reserve; the controller's
	// planner.Planner.ReservedForScarce): kube-scheduler's
	// TaintToleration counts the taints a pod does not tolerate, so a pod
	// without GPU claims goes to such a node only when no node with fewer
	// taints fits it. What the chart deploys.
	steerScarce
)

// steerTaint answers how many of gpulink's steering taints node i
// carries now (0, 1, or 2 under steerIdleNode and steerScarce), under one
// mode, computing it again only after the node changed or (for the modes
// that read a demand mix) the mix was refreshed, as the controller's
// reconciler would.
type steerTaint struct {
	mode steerMode
	// mix is the demand mix in use (steerUsable), scarce the same
	// weighed by scarcity (steerScarce).
	mix    func() *allocate.DemandMix
	scarce func(c *Cluster) *allocate.DemandMix
	// Per node: the taint, the node's change count and the mix it was
	// computed at; valid marks entries computed at least once.
	tainted []int
	valid   []bool
	at      []uint64
	mixAt   []*allocate.DemandMix
}

func (s *steerTaint) taints(c *Cluster, i int) int {
	if s.tainted == nil {
		s.tainted = make([]int, len(c.nodes))
		s.valid = make([]bool, len(c.nodes))
		s.at = make([]uint64, len(c.nodes))
		s.mixAt = make([]*allocate.DemandMix, len(c.nodes))
	}
	n := c.nodes[i]
	var m *allocate.DemandMix
	switch s.mode {
	case steerUsable, steerWholeUsable:
		m = s.mix()
	case steerScarce:
		m = s.scarce(c)
	}
	if s.valid[i] && s.at[i] == n.changes && s.mixAt[i] == m {
		return s.tainted[i]
	}
	s.tainted[i] = s.compute(n, m)
	s.valid[i], s.at[i], s.mixAt[i] = true, n.changes, m
	return s.tainted[i]
}

func (s *steerTaint) compute(n *nodeState, m *allocate.DemandMix) int {
	if n.kind == nil {
		return 0
	}
	switch s.mode {
	case steerAnyFree:
		return b2i(n.leftTotal() > 0)
	case steerWholeFree:
		return b2i(n.freeGPUs() > 0)
	case steerUsable:
		return b2i(m.Usable(n.alloc))
	case steerWholeUsable:
		return b2i(n.freeGPUs() > 0 && m.Usable(n.alloc))
	case steerIdleNode:
		free := n.freeGPUs()
		return b2i(free > 0) + b2i(free == len(n.left))
	case steerScarce:
		if n.freeGPUs() == 0 {
			return b2i(m.KeepForScarce(n.alloc))
		}
		return 1 + b2i(m.Reserve(n.alloc))
	}
	return 0
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
