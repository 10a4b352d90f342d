package v1alpha1

import (
	"github.com/gpulink/gpulink/driver/topology"
)

// RequiredLink is the minimum link class the allocator must enforce:
// LinkNone (best effort) unless the policy is Required. A MinLink that does
// not parse also yields LinkNone; Validate reports it, and callers are
// expected to have validated first.
func (c *GpuConfig) RequiredLink() topology.Link {
	if c == nil || c.Topology == nil || c.Topology.Policy != TopologyRequired {
		return topology.LinkNone
	}
	l, err := topology.ParseLinkClass(c.Topology.MinLink)
	if err != nil {
		return topology.LinkNone
	}
	return l
}
