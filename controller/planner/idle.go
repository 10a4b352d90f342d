package planner

// HasIdleGPU tells whether node n has a GPU no claim holds any part of,
// as this ledger counts claims (allocated, or assumed by a decision in
// flight): a GPU published whole that is neither given out nor shared and
// carries no NoSchedule or NoExecute device taint besides gpulink's
// managed one, or a GPU in MIG mode (partitioned already or on demand)
// none of whose MIG devices is held. It is what the controller's
// steering taint marks (controller/steer): a node with such a GPU still
// has a whole GPU to keep for GPU pods. A nil node has none.
func (l *Ledger) HasIdleGPU(n *NodeInventory) bool {
	if n == nil {
		return false
	}
	// The GPUs no pod can be given (n.unavailable, as the scarcity
	// weighing counts them) are as good as taken.
	usage := unavailableAsTaken(n, l.NodeUsage(n))
	for p := range n.Devices {
		if u := usage[p]; !u.Exclusive && u.Shares == 0 {
			return true
		}
	}
	if len(n.MIG) == 0 {
		return false
	}
	held := l.migUsage(n)
	// busy marks the GPUs in MIG mode with a held or tainted partition;
	// parents lists every such GPU.
	busy, parents := map[int]bool{}, map[int]bool{}
	for i, d := range n.MIG {
		parents[d.Parent] = true
		if _, tainted := untolerated(d.scheduling, nil); held[i] || tainted {
			busy[d.Parent] = true
		}
	}
	for p := range parents {
		if !busy[p] {
			return true
		}
	}
	return false
}
