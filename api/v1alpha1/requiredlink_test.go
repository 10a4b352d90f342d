package v1alpha1

import (
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func TestRequiredLink(t *testing.T) {
	tests := []struct {
		name string
		cfg  *GpuConfig
		want topology.Link
	}{
		{"nil config", nil, topology.LinkNone},
		{"no topology", &GpuConfig{}, topology.LinkNone},
		{"best effort ignores minLink", &GpuConfig{Topology: &TopologyConfig{Policy: TopologyBestEffort, MinLink: "NV2"}}, topology.LinkNone},
		{"unset policy is best effort", &GpuConfig{Topology: &TopologyConfig{MinLink: "NV2"}}, topology.LinkNone},
		{"any NVLink", &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"}}, topology.LinkNVLink},
		{"lane count", &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NV2"}}, topology.NVLink(2)},
		{"PCIe class", &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "PHB"}}, topology.LinkPHB},
		{"unparsable minLink", &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "FAST"}}, topology.LinkNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.RequiredLink(); got != tt.want {
				t.Errorf("RequiredLink = %v, want %v", got, tt.want)
			}
		})
	}
}
