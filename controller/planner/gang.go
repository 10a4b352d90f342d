package planner

import "github.com/gpulink/gpulink/driver/allocate"

// WholeGPUs counts the whole GPUs a pod's pending claims ask for (each
// request's first alternative; shares, MIG devices and allocationMode All
// count none): the "× 8 GPUs" of a gang's messages and the weight of its
// domain-level fragmentation measures.
func WholeGPUs(pending []*Claim) int {
	n := 0
	for _, ic := range pending {
		for _, rs := range ic.Requests {
			if len(rs.Alternatives) == 0 {
				continue
			}
			if a := rs.Alternatives[0]; !a.Share && !a.All && !a.MIG {
				n += a.Count
			}
		}
	}
	return n
}

// GPUCounts returns a node's free GPUs (no claim holds them, whole or in
// shares) and its GPUs, as the ledger counts them now.
func (p *Planner) GPUCounts(node string) (free, total int) {
	n := p.inv.Node(node)
	if n == nil {
		return 0, 0
	}
	return p.ledger.FreeGPUs(n), len(n.Devices)
}

// FreeGPUs counts a node's GPUs nothing uses (NodeUsage's zero usage),
// without copying their usage.
func (l *Ledger) FreeGPUs(n *NodeInventory) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	free := 0
	for _, d := range n.Devices {
		if t := l.usage[DeviceKey{Pool: n.Pool, Device: d.Name}]; t == nil || t.gpuUsage() == (allocate.GPUUsage{}) {
			free++
		}
	}
	return free
}
