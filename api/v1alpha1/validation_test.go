package v1alpha1

import (
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  *GpuConfig
		want []string // substrings of the error; none means valid
	}{
		{name: "empty is valid", cfg: &GpuConfig{}},
		{name: "required with NVLink", cfg: &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"}}},
		{name: "required with PCIe class", cfg: &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "PXB"}}},
		{name: "best effort with minLink is allowed", cfg: &GpuConfig{Topology: &TopologyConfig{Policy: TopologyBestEffort, MinLink: "NV2"}}},
		{name: "None with share sizes is allowed", cfg: &GpuConfig{Sharing: &SharingConfig{Strategy: SharingNone, DefaultCores: ptr(int64(50))}}},
		{name: "bounds are inclusive", cfg: &GpuConfig{Sharing: &SharingConfig{DefaultCores: ptr(int64(100)), MaxSharesPerGPU: ptr(1), DefaultMemory: quantity("1")}}},
		{name: "placement", cfg: &GpuConfig{Placement: &PlacementConfig{Node: PlacementSpread, GPU: PlacementBinpack}}},
		{
			name: "unknown placement",
			cfg:  &GpuConfig{Placement: &PlacementConfig{Node: "binpack", GPU: "Random"}},
			want: []string{`placement.node: Unsupported value: "binpack": supported values: "Binpack", "Spread"`, `placement.gpu: Unsupported value: "Random"`},
		},
		{
			name: "unknown policy",
			cfg:  &GpuConfig{Topology: &TopologyConfig{Policy: "Sometimes"}},
			want: []string{`topology.policy: Unsupported value: "Sometimes": supported values: "BestEffort", "Required"`},
		},
		{
			name: "unknown link class",
			cfg:  &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "FAST"}},
			want: []string{`topology.minLink: Invalid value: "FAST"`},
		},
		{
			name: "minLink is checked under best effort too",
			cfg:  &GpuConfig{Topology: &TopologyConfig{MinLink: "NV19"}},
			want: []string{`topology.minLink: Invalid value: "NV19"`},
		},
		{
			name: "required without minLink",
			cfg:  &GpuConfig{Topology: &TopologyConfig{Policy: TopologyRequired}},
			want: []string{"topology.minLink: Required value"},
		},
		{
			name: "unknown strategy",
			cfg:  &GpuConfig{Sharing: &SharingConfig{Strategy: "TimeSlice"}},
			want: []string{`sharing.strategy: Unsupported value: "TimeSlice": supported values: "MPS", "HAMiCore", "None"`},
		},
		{
			name: "cores above 100",
			cfg:  &GpuConfig{Sharing: &SharingConfig{DefaultCores: ptr(int64(130))}},
			want: []string{"sharing.defaultCores: Invalid value: 130: must be between 1 and 100"},
		},
		{
			name: "zero cores",
			cfg:  &GpuConfig{Sharing: &SharingConfig{DefaultCores: ptr(int64(0))}},
			want: []string{"sharing.defaultCores: Invalid value: 0: must be between 1 and 100"},
		},
		{
			name: "zero memory",
			cfg:  &GpuConfig{Sharing: &SharingConfig{DefaultMemory: quantity("0")}},
			want: []string{`sharing.defaultMemory: Invalid value: "0": must be a positive whole number of bytes`},
		},
		{
			name: "fractional bytes",
			cfg:  &GpuConfig{Sharing: &SharingConfig{DefaultMemory: quantity("100m")}},
			want: []string{`sharing.defaultMemory: Invalid value: "100m"`},
		},
		{
			name: "negative memory",
			cfg:  &GpuConfig{Sharing: &SharingConfig{DefaultMemory: quantity("-1Gi")}},
			want: []string{`sharing.defaultMemory: Invalid value: "-1Gi"`},
		},
		{
			name: "too many shares",
			cfg:  &GpuConfig{Sharing: &SharingConfig{MaxSharesPerGPU: ptr(101)}},
			want: []string{"sharing.maxSharesPerGPU: Invalid value: 101: must be between 1 and 100"},
		},
		{
			name: "memory over-commit below 100",
			cfg:  &GpuConfig{Sharing: &SharingConfig{MemoryOvercommitPercent: ptr(50)}},
			want: []string{"sharing.memoryOvercommitPercent: Invalid value: 50: must be between 100 (no over-commit) and 400"},
		},
		{
			name: "memory over-commit above 400",
			cfg:  &GpuConfig{Sharing: &SharingConfig{MemoryOvercommitPercent: ptr(401)}},
			want: []string{"sharing.memoryOvercommitPercent: Invalid value: 401"},
		},
		{name: "both priorities", cfg: &GpuConfig{Sharing: &SharingConfig{Priority: ptr(PriorityHigh)}}},
		{name: "low priority", cfg: &GpuConfig{Sharing: &SharingConfig{Priority: ptr(PriorityLow)}}},
		{
			name: "priority 2",
			cfg:  &GpuConfig{Sharing: &SharingConfig{Priority: ptr(2)}},
			want: []string{"sharing.priority: Invalid value: 2: must be 0 (high) or 1 (low)"},
		},
		{
			name: "negative priority",
			cfg:  &GpuConfig{Sharing: &SharingConfig{Priority: ptr(-1)}},
			want: []string{"sharing.priority: Invalid value: -1: must be 0 (high) or 1 (low)"},
		},
		{name: "Concurrent MPS", cfg: &GpuConfig{Sharing: &SharingConfig{Strategy: SharingMPS, MPSMode: MPSConcurrent}}},
		{name: "Isolated MPS", cfg: &GpuConfig{Sharing: &SharingConfig{Strategy: SharingMPS, MPSMode: MPSIsolated}}},
		{name: "mpsMode with the default strategy", cfg: &GpuConfig{Sharing: &SharingConfig{MPSMode: MPSConcurrent}}},
		{
			name: "unknown mpsMode",
			cfg:  &GpuConfig{Sharing: &SharingConfig{MPSMode: "concurrent"}},
			want: []string{`sharing.mpsMode: Unsupported value: "concurrent": supported values: "Isolated", "Concurrent"`},
		},
		{
			name: "mpsMode under HAMiCore",
			cfg:  &GpuConfig{Sharing: &SharingConfig{Strategy: SharingHAMiCore, MPSMode: MPSConcurrent}},
			want: []string{`sharing.mpsMode: Invalid value: "Concurrent": applies to sharing.strategy MPS only, not HAMiCore`},
		},
		{
			name: "mpsMode under None",
			cfg:  &GpuConfig{Sharing: &SharingConfig{Strategy: SharingNone, MPSMode: MPSIsolated}},
			want: []string{`sharing.mpsMode: Invalid value: "Isolated": applies to sharing.strategy MPS only, not None`},
		},
		{
			name: "every problem is reported at once",
			cfg: &GpuConfig{
				Topology: &TopologyConfig{Policy: "Sometimes", MinLink: "FAST"},
				Sharing:  &SharingConfig{DefaultCores: ptr(int64(130)), MaxSharesPerGPU: ptr(0)},
			},
			want: []string{"topology.policy", "topology.minLink", "sharing.defaultCores", "sharing.maxSharesPerGPU"},
		},
		{name: "nil config", cfg: nil, want: []string{"configuration is missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
