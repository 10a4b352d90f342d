package gang

import "fmt"

func validate(h *Hierarchy, req Request, nodes []Node) error {
	if h == nil {
		return fmt.Errorf("%w: hierarchy is nil", ErrInvalid)
	}
	if req.Pods < 1 {
		return fmt.Errorf("%w: gang %q: pods %d: must be at least 1", ErrInvalid, req.Name, req.Pods)
	}
	if req.MinCount < 0 || req.MinCount > req.Pods {
		return fmt.Errorf("%w: gang %q: minCount %d: must be 0..pods (%d)", ErrInvalid, req.Name, req.MinCount, req.Pods)
	}
	if req.GPUsPerPod < 0 {
		return fmt.Errorf("%w: gang %q: gpusPerPod %d: must not be negative", ErrInvalid, req.Name, req.GPUsPerPod)
	}
	if req.Level < 0 || req.Level > h.Cluster() {
		return fmt.Errorf("%w: gang %q: level %d: must be 0..%d", ErrInvalid, req.Name, req.Level, h.Cluster())
	}
	switch req.Constraint {
	case "", Preferred, Required:
	default:
		return fmt.Errorf("%w: gang %q: constraint %q: must be %s or %s", ErrInvalid, req.Name, req.Constraint, Preferred, Required)
	}
	for i, d := range req.Demand {
		if d.Pods < 1 || d.GPUsPerPod < 0 || d.Count < 1 {
			return fmt.Errorf("%w: gang %q: demand[%d]: pods %d, gpusPerPod %d, count %d: pods and count must be at least 1, gpusPerPod not negative", ErrInvalid, req.Name, i, d.Pods, d.GPUsPerPod, d.Count)
		}
	}
	seen := make(map[string]struct{}, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		if n.Name == "" {
			return fmt.Errorf("%w: node %d: name is empty", ErrInvalid, i)
		}
		if _, dup := seen[n.Name]; dup {
			return fmt.Errorf("%w: node %q: appears twice", ErrInvalid, n.Name)
		}
		seen[n.Name] = struct{}{}
		if n.Slots < 0 || n.FreeGPUs < 0 || n.TotalGPUs < 0 {
			return fmt.Errorf("%w: node %q: slots %d, freeGPUs %d, totalGPUs %d: must not be negative", ErrInvalid, n.Name, n.Slots, n.FreeGPUs, n.TotalGPUs)
		}
		if len(n.Domains) > h.Cluster()-1 {
			return fmt.Errorf("%w: node %q: %d domains for a hierarchy of %d levels", ErrInvalid, n.Name, len(n.Domains), h.Cluster()-1)
		}
		for k, s := range n.AlignedSlots {
			if s < 0 {
				return fmt.Errorf("%w: node %q: alignedSlots[%q] %d: must not be negative", ErrInvalid, n.Name, k, s)
			}
		}
	}
	return nil
}
