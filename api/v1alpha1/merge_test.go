package v1alpha1

import (
	"testing"
)

func TestMerge(t *testing.T) {
	class := &GpuConfig{
		Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"},
		Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("8Gi"), MaxSharesPerGPU: ptr(4)},
	}
	tests := []struct {
		name    string
		configs []*GpuConfig
		want    *GpuConfig
	}{
		{name: "nothing", configs: nil, want: &GpuConfig{}},
		{name: "only nils", configs: []*GpuConfig{nil, nil}, want: &GpuConfig{}},
		{name: "one config is copied", configs: []*GpuConfig{class}, want: class},
		{
			name: "claim overrides the fields it sets",
			configs: []*GpuConfig{class, {
				Topology: &TopologyConfig{MinLink: "NV2"},
				Sharing:  &SharingConfig{DefaultMemory: quantity("2Gi"), DefaultCores: ptr(int64(10))},
			}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NV2"},
				Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("2Gi"), DefaultCores: ptr(int64(10)), MaxSharesPerGPU: ptr(4)},
			},
		},
		{
			name:    "claim relaxes the policy; minLink stays but is ignored",
			configs: []*GpuConfig{class, {Topology: &TopologyConfig{Policy: TopologyBestEffort}}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort, MinLink: "NVLink"},
				Sharing:  class.Sharing,
			},
		},
		{
			name:    "placement merges field by field",
			configs: []*GpuConfig{{Placement: &PlacementConfig{Node: PlacementSpread, GPU: PlacementSpread}}, {Placement: &PlacementConfig{GPU: PlacementBinpack}}},
			want:    &GpuConfig{Placement: &PlacementConfig{Node: PlacementSpread, GPU: PlacementBinpack}},
		},
		{
			name:    "nil in the middle is skipped",
			configs: []*GpuConfig{{Sharing: &SharingConfig{Strategy: SharingNone}}, nil, {Topology: &TopologyConfig{Policy: TopologyBestEffort}}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingNone},
			},
		},
		{
			// A claim may choose its own priority over its class's,
			// including 0, which must not read as "unset".
			name:    "claim's priority 0 replaces the class's 1",
			configs: []*GpuConfig{{Sharing: &SharingConfig{Priority: ptr(PriorityLow)}}, {Sharing: &SharingConfig{Priority: ptr(PriorityHigh)}}},
			want:    &GpuConfig{Sharing: &SharingConfig{Priority: ptr(PriorityHigh)}},
		},
		{
			name:    "class's priority falls through",
			configs: []*GpuConfig{{Sharing: &SharingConfig{Priority: ptr(PriorityLow)}}, {Sharing: &SharingConfig{DefaultCores: ptr(int64(5))}}},
			want:    &GpuConfig{Sharing: &SharingConfig{Priority: ptr(PriorityLow), DefaultCores: ptr(int64(5))}},
		},
		{
			name:    "class's mpsMode falls through a claim layer without one",
			configs: []*GpuConfig{{Sharing: &SharingConfig{MPSMode: MPSConcurrent}}, {Sharing: &SharingConfig{Priority: ptr(PriorityLow)}}},
			want:    &GpuConfig{Sharing: &SharingConfig{MPSMode: MPSConcurrent, Priority: ptr(PriorityLow)}},
		},
		{
			name:    "a later mpsMode replaces an earlier one",
			configs: []*GpuConfig{{Sharing: &SharingConfig{MPSMode: MPSConcurrent}}, {Sharing: &SharingConfig{MPSMode: MPSIsolated}}},
			want:    &GpuConfig{Sharing: &SharingConfig{MPSMode: MPSIsolated}},
		},
		{
			name:    "last of three wins",
			configs: []*GpuConfig{{Sharing: &SharingConfig{DefaultCores: ptr(int64(1))}}, {Sharing: &SharingConfig{DefaultCores: ptr(int64(2))}}, {Sharing: &SharingConfig{DefaultCores: ptr(int64(3))}}},
			want:    &GpuConfig{Sharing: &SharingConfig{DefaultCores: ptr(int64(3))}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Merge(tt.configs...)
			if got.APIVersion != APIVersion || got.Kind != Kind {
				t.Errorf("type meta = %q %q, want %q %q", got.APIVersion, got.Kind, APIVersion, Kind)
			}
			assertConfigEqual(t, got, tt.want)
		})
	}
}

func TestMergeDoesNotAlias(t *testing.T) {
	class := &GpuConfig{
		Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"},
		Sharing:  &SharingConfig{DefaultMemory: quantity("8Gi"), DefaultCores: ptr(int64(20)), MaxSharesPerGPU: ptr(4)},
	}
	got := Merge(class)
	got.Topology.MinLink = "SYS"
	*got.Sharing.DefaultCores = 99
	*got.Sharing.MaxSharesPerGPU = 99
	got.Sharing.DefaultMemory.Set(1)
	if class.Topology.MinLink != "NVLink" || *class.Sharing.DefaultCores != 20 || *class.Sharing.MaxSharesPerGPU != 4 || class.Sharing.DefaultMemory.String() != "8Gi" {
		t.Fatalf("changing the merge result changed its input: %+v %+v", *class.Topology, *class.Sharing)
	}
}
