package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies c into out; out shares no memory with c afterwards.
func (c *GpuConfig) DeepCopyInto(out *GpuConfig) {
	*out = *c
	out.Topology = c.Topology.DeepCopy()
	out.Sharing = c.Sharing.DeepCopy()
	out.Placement = c.Placement.DeepCopy()
}

// DeepCopy returns an independent copy of p (nil for nil).
func (p *PlacementConfig) DeepCopy() *PlacementConfig {
	if p == nil {
		return nil
	}
	out := *p
	return &out
}

// DeepCopy returns an independent copy of c (nil for nil).
func (c *GpuConfig) DeepCopy() *GpuConfig {
	if c == nil {
		return nil
	}
	out := new(GpuConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject makes GpuConfig a runtime.Object so the apimachinery
// serializers (and callers' schemes) can handle it.
func (c *GpuConfig) DeepCopyObject() runtime.Object {
	if out := c.DeepCopy(); out != nil {
		return out
	}
	return nil
}

// DeepCopy returns an independent copy of t (nil for nil).
func (t *TopologyConfig) DeepCopy() *TopologyConfig {
	if t == nil {
		return nil
	}
	out := *t
	return &out
}

// DeepCopy returns an independent copy of s (nil for nil).
func (s *SharingConfig) DeepCopy() *SharingConfig {
	if s == nil {
		return nil
	}
	out := *s
	if s.DefaultMemory != nil {
		q := s.DefaultMemory.DeepCopy()
		out.DefaultMemory = &q
	}
	if s.DefaultCores != nil {
		v := *s.DefaultCores
		out.DefaultCores = &v
	}
	if s.MaxSharesPerGPU != nil {
		v := *s.MaxSharesPerGPU
		out.MaxSharesPerGPU = &v
	}
	if s.MemoryOvercommitPercent != nil {
		v := *s.MemoryOvercommitPercent
		out.MemoryOvercommitPercent = &v
	}
	if s.Priority != nil {
		v := *s.Priority
		out.Priority = &v
	}
	return &out
}
