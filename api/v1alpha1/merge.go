package v1alpha1

// Merge layers configurations: every field a later config sets replaces the
// same field of the earlier ones; unset fields fall through. Nil configs are
// skipped, and the inputs are never modified. Pass the DeviceClass's config
// first, then the claim's.
//
// Merge decoded configs, not defaulted ones: after Default every field is
// set, so a defaulted later layer would erase all earlier settings. Resolve
// does it in the right order.
func Merge(configs ...*GpuConfig) *GpuConfig {
	out := &GpuConfig{}
	out.APIVersion = APIVersion
	out.Kind = Kind
	for _, c := range configs {
		if c == nil {
			continue
		}
		if t := c.Topology; t != nil {
			if out.Topology == nil {
				out.Topology = &TopologyConfig{}
			}
			if t.Policy != "" {
				out.Topology.Policy = t.Policy
			}
			if t.MinLink != "" {
				out.Topology.MinLink = t.MinLink
			}
		}
		if s := c.Sharing.DeepCopy(); s != nil {
			if out.Sharing == nil {
				out.Sharing = &SharingConfig{}
			}
			if s.Strategy != "" {
				out.Sharing.Strategy = s.Strategy
			}
			if s.DefaultMemory != nil {
				out.Sharing.DefaultMemory = s.DefaultMemory
			}
			if s.DefaultCores != nil {
				out.Sharing.DefaultCores = s.DefaultCores
			}
			if s.MaxSharesPerGPU != nil {
				out.Sharing.MaxSharesPerGPU = s.MaxSharesPerGPU
			}
			if s.MemoryOvercommitPercent != nil {
				out.Sharing.MemoryOvercommitPercent = s.MemoryOvercommitPercent
			}
			if s.Priority != nil {
				out.Sharing.Priority = s.Priority
			}
			if s.MPSMode != "" {
				out.Sharing.MPSMode = s.MPSMode
			}
		}
		if p := c.Placement; p != nil {
			if out.Placement == nil {
				out.Placement = &PlacementConfig{}
			}
			if p.Node != "" {
				out.Placement.Node = p.Node
			}
			if p.GPU != "" {
				out.Placement.GPU = p.GPU
			}
		}
	}
	return out
}
