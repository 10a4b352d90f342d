package v1alpha1

import (
	"strings"
	"testing"
)

func TestDefault(t *testing.T) {
	tests := []struct {
		name string
		in   *GpuConfig
		want *GpuConfig
	}{
		{
			name: "empty gets every default",
			in:   &GpuConfig{},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing: &SharingConfig{
					Strategy:        SharingMPS,
					DefaultMemory:   quantity("4Gi"),
					DefaultCores:    ptr(int64(25)),
					MaxSharesPerGPU: ptr(16),
					MPSMode:         MPSIsolated,
				},
			},
		},
		{
			name: "explicit values are kept",
			in: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"},
				Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("10Gi"), DefaultCores: ptr(int64(50)), MaxSharesPerGPU: ptr(2)},
			},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"},
				Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("10Gi"), DefaultCores: ptr(int64(50)), MaxSharesPerGPU: ptr(2)},
			},
		},
		{
			name: "partial sharing is completed",
			in:   &GpuConfig{Sharing: &SharingConfig{DefaultCores: ptr(int64(10))}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingMPS, DefaultMemory: quantity("4Gi"), DefaultCores: ptr(int64(10)), MaxSharesPerGPU: ptr(16), MPSMode: MPSIsolated},
			},
		},
		{
			name: "Concurrent MPS is kept",
			in:   &GpuConfig{Sharing: &SharingConfig{MPSMode: MPSConcurrent}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingMPS, DefaultMemory: quantity("4Gi"), DefaultCores: ptr(int64(25)), MaxSharesPerGPU: ptr(16), MPSMode: MPSConcurrent},
			},
		},
		{
			name: "HAMiCore gets no MPS mode",
			in:   &GpuConfig{Sharing: &SharingConfig{Strategy: SharingHAMiCore}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("4Gi"), DefaultCores: ptr(int64(25)), MaxSharesPerGPU: ptr(16)},
			},
		},
		{
			name: "strategy None gets no share sizes",
			in:   &GpuConfig{Sharing: &SharingConfig{Strategy: SharingNone}},
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingNone},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Default()
			if tt.in.APIVersion != APIVersion || tt.in.Kind != Kind {
				t.Errorf("type meta = %q %q, want %q %q", tt.in.APIVersion, tt.in.Kind, APIVersion, Kind)
			}
			assertConfigEqual(t, tt.in, tt.want)
			if err := tt.in.Validate(); err != nil {
				t.Errorf("defaulted config does not validate: %v", err)
			}
		})
	}
}

func TestDefaultNilIsNoop(t *testing.T) {
	var c *GpuConfig
	c.Default()
	if c != nil {
		t.Fatalf("nil config became %+v", c)
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    *GpuConfig
		wantErr string
	}{
		{
			name: "defaults applied",
			raw:  "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing:\n  defaultMemory: 8Gi\n",
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingMPS, DefaultMemory: quantity("8Gi"), DefaultCores: ptr(int64(25)), MaxSharesPerGPU: ptr(16), MPSMode: MPSIsolated},
			},
		},
		{
			name:    "validation runs",
			raw:     "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing:\n  defaultCores: 130\n",
			wantErr: "sharing.defaultCores: Invalid value: 130: must be between 1 and 100",
		},
		{
			name:    "decoding runs",
			raw:     "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing:\n  maxShares: 3\n",
			wantErr: `unknown field "sharing.maxShares"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Normalize([]byte(tt.raw))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Normalize error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			assertConfigEqual(t, got, tt.want)
		})
	}
}
