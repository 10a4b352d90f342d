package planner

import (
	"slices"

	"github.com/gpulink/gpulink/driver/allocate"
)

// Nodes kept whole for the scarce shapes of the demand mix (the
// controller's second steering taint, controller/steer.ScarceTaintKey;
// docs/cpu-pods.md).
//
// The demand mix weighs each recent pod shape by how few nodes could run
// it (allocate.DemandMix.WithScarcity). On FGD's trace with GPU-model
// constraints, the 8-GPU pods that ask for 120 of a node's 128 cores fit
// only the idle nodes of one model, and failed below 100 % arrived
// because kube-scheduler had spread pods without GPUs over those nodes.
// A second PreferNoSchedule taint on such nodes makes kube-scheduler put
// those pods there only when no node with fewer of gpulink's taints fits
// them (docs/performance/trace.md).

// weighDemand weighs a new snapshot of the demand mix at once, rather
// than at the next decision, so that the nodes kept for its scarce shapes
// follow it without waiting for a decision. Call it under the decision
// lock, after the decision's devices and pod are counted.
func (p *Planner) weighDemand() {
	if p.demand.hist == nil || p.demand.hist.Mix() == p.demand.mix {
		return
	}
	p.demand.policy(allocate.Policy{}, p.nodesNowOf(p.inv.All()))
}

// ReservedForScarce tells whether a node should be kept whole for the
// scarce shapes of the demand mix (allocate.DemandMix.Reserve): it has
// gpulink GPUs, all of them published and idle (no claim holds any part
// of one, no MIG partition of one is held, none is tainted), and a shape
// weighed allocate.ReserveScarcity times or more could run on it with
// its CPU and memory left. False while ranking by stranding is off, no
// mix has been weighed yet, or the node's allocatable is unknown. Safe
// for concurrent use with decisions: it reads the ledger, the inventory
// and the pods counted on the node under their own locks, and the last
// weighed mix, which is never changed once published.
func (p *Planner) ReservedForScarce(node string) bool {
	mix, n, host := p.scarceView(node)
	if mix == nil || !p.ledger.allIdle(n) {
		return false
	}
	return mix.Reserve(&allocate.NodeState{Name: node, Topology: n.Topo, Usage: p.ledger.NodeUsage(n), Host: host})
}

// scarceView is what ReservedForScarce and KeptForScarce weigh a node
// with: the last weighed mix, the node's inventory with all of its GPUs
// published, and its CPU and memory left. mix is nil when there is no
// mix, the node has no gpulink GPU or not all of them published, or its
// allocatable is unknown.
func (p *Planner) scarceView(node string) (mix *allocate.DemandMix, n *NodeInventory, host *allocate.Host) {
	mix = p.demand.published.Load()
	if mix == nil {
		return nil, nil, nil
	}
	n = p.inv.Node(node)
	if n == nil || n.Topo == nil || n.Topo.Len() == 0 || len(n.Devices) != n.Topo.Len() {
		return nil, nil, nil
	}
	host = p.filter.HostLeft(node)
	if host == nil {
		return nil, nil, nil
	}
	return mix, n, host
}

// allIdle tells whether no GPU of n is held (whole, shared, or a MIG
// partition of it) or unavailable (n.unavailable: not published, or
// tainted against pods that do not tolerate it), as the inventory built
// n.
func (l *Ledger) allIdle(n *NodeInventory) bool {
	if len(n.unavailable) > 0 {
		return false
	}
	for _, u := range l.NodeUsage(n) {
		if u.Exclusive || u.Shares > 0 {
			return false
		}
	}
	return len(n.MIG) == 0 || !slices.Contains(l.migUsage(n), true)
}

// KeptForScarce tells whether a node's unallocated GPU, the rests of its
// shared GPUs included, should be kept from pods without GPUs for a shape
// of the demand mix so scarce that only a sliver of the cluster's
// unallocated GPU can hold it (allocate.DemandMix.KeepForScarce): the
// controller then keeps the first steering taint on the node although no
// GPU of it is idle. The node's GPUs must all be published; a GPU tainted
// against pods that do not tolerate it counts as taken. False while
// ranking by stranding is off, no mix has been weighed yet, the node's
// allocatable is unknown, or it has MIG devices (the mix's shapes are
// whole GPUs and shares, HasIdleGPU answers for MIG). Safe for concurrent
// use with decisions, as ReservedForScarce.
func (p *Planner) KeptForScarce(node string) bool {
	mix, n, host := p.scarceView(node)
	if mix == nil || len(n.MIG) > 0 {
		return false
	}
	usage := unavailableAsTaken(n, p.ledger.NodeUsage(n))
	return mix.KeepForScarce(&allocate.NodeState{Name: node, Topology: n.Topo, Usage: usage, Host: host})
}
