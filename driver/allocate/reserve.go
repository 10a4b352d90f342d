package allocate

// ReserveScarcity is how scarce a shape of the demand mix must be for
// Reserve to keep a node for it: WithScarcity weighed it at least this
// many times, i.e. the nodes that could run it now hold at most 1/16 of
// the cluster's unallocated GPU.
//
// On FGD's trace that is the pods asking for 8 GPUs with 120 of a node's
// 128 cores (the 39 G3 nodes, 312 of 6,212 GPUs: about 20 times when the
// cluster is idle) and, on lists that pin pods to GPU models, the pods
// pinned to the rarer models once those fill; not the pods most nodes
// could run. Measured with 4 (and on any node with an idle GPU, not only
// nodes all of whose GPUs are idle), the nodes of every model a pinned
// shape names got the second taint, and the pods without GPUs steered
// off them crowded onto the partly used nodes instead, whose free GPUs
// they then stranded (docs/performance/trace.md).
const ReserveScarcity = 16

// Reserve tells whether n is a node to keep whole for the scarce pods of
// the mix: all of its GPUs are idle (none given out or shared) and a
// shape that WithScarcity weighed at least ReserveScarcity times could
// run on it as it is now (its CPU and memory left, its GPU product, its
// GPUs). A pod without GPUs placed there takes CPU and memory that only
// such a node has, and nothing else could serve that shape: the
// controller marks such nodes with a second steering taint, so that
// kube-scheduler puts those pods on them last (controller/steer). A mix
// without scarcity, or nil, keeps no node.
func (m *DemandMix) Reserve(n *NodeState) bool {
	return m.ScarceUsable(n, ReserveScarcity) && idle(n)
}

// ScarceUsable tells whether a scarce shape of the mix could still run on
// n as it is now (as Usable counts it): a shape that WithScarcity weighed
// at least minFactor times (the unallocated GPU of the nodes that could
// run it at most 1/minFactor of all). A mix without scarcity, or nil, has
// no scarce shape.
func (m *DemandMix) ScarceUsable(n *NodeState, minFactor int64) bool {
	if m == nil || m.scarcity == nil {
		return false
	}
	return m.usable(n, func(i int) bool { return m.scarcity[i] >= minFactor*scarcityScale })
}

// idle tells whether every GPU of n is unused: neither given out whole
// nor shared.
func idle(n *NodeState) bool {
	if n == nil || n.Topology == nil || n.Topology.Len() == 0 {
		return false
	}
	for p := range n.Topology.Len() {
		if u := n.usage(p); u.Exclusive || u.Shares > 0 {
			return false
		}
	}
	return true
}

// KeepScarceShares is how scarce a shape of the demand mix must be for
// KeepForScarce to keep the rest of a node's shared GPUs for it: weighed
// at least this many times, i.e. the nodes that could run it now hold at
// most 1/256 of the cluster's unallocated GPU. On FGD's trace that is a
// share pinned to the A10 (2 of 6,212 GPUs, each on a node of 128
// cores): once a share was placed there, the node had no idle GPU, and
// pods without GPUs spread onto its cores until the next A10 shares
// failed for CPU. With 16 (ReserveScarcity), the shared nodes of every
// pinned model were kept too, and four of the lists with pinned models
// left 0.02-0.04 point more GPU unallocated from 100 % arrived
// (docs/performance/trace.md).
const KeepScarceShares = 256

// KeepForScarce tells whether the unallocated GPU of n, shared GPUs'
// rests included, is worth keeping from pods without GPUs because a shape
// of the mix weighed at least KeepScarceShares times could still run on
// n as it is now (its CPU and memory left, its product, what its GPUs
// have left). The controller keeps its first steering taint on such a
// node even when it has no idle GPU (controller/steer). A mix without
// scarcity, or nil, keeps nothing.
func (m *DemandMix) KeepForScarce(n *NodeState) bool {
	return m.ScarceUsable(n, KeepScarceShares)
}
