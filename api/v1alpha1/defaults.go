package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/driver/allocate"
)

// Defaults Default fills in. The share sizes aim at inference services:
// 4Gi fits a small model on any data-centre GPU gpulink targets (16Gi and
// up), and a quarter of the SMs keeps a few of them from starving one
// another. The share cap is the allocator's own default (the MPS client
// limit of pre-Volta GPUs, the lowest any supported GPU has), so the
// default is safe everywhere.
const (
	DefaultTopologyPolicy  = TopologyBestEffort
	DefaultSharingStrategy = SharingMPS
	DefaultShareMemory     = "4Gi"
	DefaultShareCores      = int64(25)
	DefaultMaxSharesPerGPU = allocate.DefaultMaxSharesPerGPU
	// DefaultMPSMode keeps a server per claim: limits a container cannot
	// raise for long, the behaviour of every release before the setting.
	DefaultMPSMode = MPSIsolated
)

// Default fills every unset field with its default, so consumers need no
// nil checks after Normalize. Share sizes are left unset under strategy
// None, where no shares exist, and mpsMode under any strategy but MPS. It
// sets apiVersion and kind as well, which lets a config built in code
// round-trip through Decode.
func (c *GpuConfig) Default() {
	if c == nil {
		return
	}
	c.APIVersion = APIVersion
	c.Kind = Kind
	if c.Topology == nil {
		c.Topology = &TopologyConfig{}
	}
	if c.Topology.Policy == "" {
		c.Topology.Policy = DefaultTopologyPolicy
	}
	if c.Sharing == nil {
		c.Sharing = &SharingConfig{}
	}
	s := c.Sharing
	if s.Strategy == "" {
		s.Strategy = DefaultSharingStrategy
	}
	if s.Strategy == SharingNone {
		return
	}
	if s.Strategy == SharingMPS && s.MPSMode == "" {
		s.MPSMode = DefaultMPSMode
	}
	if s.DefaultMemory == nil {
		q := resource.MustParse(DefaultShareMemory)
		s.DefaultMemory = &q
	}
	if s.DefaultCores == nil {
		v := DefaultShareCores
		s.DefaultCores = &v
	}
	if s.MaxSharesPerGPU == nil {
		v := DefaultMaxSharesPerGPU
		s.MaxSharesPerGPU = &v
	}
}
