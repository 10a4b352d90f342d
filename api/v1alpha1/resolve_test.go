package v1alpha1

import (
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func TestResolve(t *testing.T) {
	const classCfg = `apiVersion: gpu.gpulink.dev/v1alpha1
kind: GpuConfig
topology: {policy: Required, minLink: NVLink}
sharing: {strategy: HAMiCore, defaultMemory: 8Gi}
`
	tests := []struct {
		name     string
		class    []string
		claim    []string
		wantLink topology.Link
		want     *GpuConfig
		wantErr  []string
	}{
		{
			name:     "no layers gives the defaults",
			wantLink: topology.LinkNone,
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort},
				Sharing:  &SharingConfig{Strategy: SharingMPS, DefaultMemory: quantity("4Gi"), DefaultCores: ptr(int64(25)), MaxSharesPerGPU: ptr(16), MPSMode: MPSIsolated},
			},
		},
		{
			name:     "claim defaults do not mask class settings",
			class:    []string{classCfg},
			claim:    []string{"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {defaultCores: 50}\n"},
			wantLink: topology.LinkNVLink,
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NVLink"},
				Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("8Gi"), DefaultCores: ptr(int64(50)), MaxSharesPerGPU: ptr(16)},
			},
		},
		{
			name:     "claim relaxes to best effort",
			class:    []string{classCfg},
			claim:    []string{`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","topology":{"policy":"BestEffort"}}`},
			wantLink: topology.LinkNone,
			want: &GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyBestEffort, MinLink: "NVLink"},
				Sharing:  &SharingConfig{Strategy: SharingHAMiCore, DefaultMemory: quantity("8Gi"), DefaultCores: ptr(int64(25)), MaxSharesPerGPU: ptr(16)},
			},
		},
		{
			name:    "bad layer is named",
			class:   []string{classCfg},
			claim:   []string{"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n", "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {maxShares: 2}\n"},
			wantErr: []string{"claim configuration: configuration layer 1", `unknown field "sharing.maxShares"`},
		},
		{
			name:    "bad class layer is named",
			class:   []string{"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {maxShares: 2}\n"},
			wantErr: []string{"DeviceClass configuration", `unknown field "sharing.maxShares"`},
		},
		{
			name:    "claim may not override the class's strategy",
			class:   []string{classCfg},
			claim:   []string{"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {strategy: MPS}\n"},
			wantErr: []string{"sharing.strategy: Forbidden", "sets MPS", "is HAMiCore"},
		},
		{
			name:    "merged result is validated",
			claim:   []string{"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\ntopology: {policy: Required}\n"},
			wantErr: []string{"topology.minLink: Required value"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(raw(tt.class), raw(tt.claim))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Resolve succeeded with %+v, want an error", got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			assertConfigEqual(t, got, tt.want)
			if l := got.RequiredLink(); l != tt.wantLink {
				t.Errorf("RequiredLink = %v, want %v", l, tt.wantLink)
			}
		})
	}
}

func TestResolveDecodedKeepsExplicitApart(t *testing.T) {
	layers, err := DecodeLayers(
		[]byte("apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {strategy: HAMiCore}\n"),
		[]byte("apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: {defaultCores: 40}\n"),
	)
	if err != nil {
		t.Fatal(err)
	}
	resolved, explicit, err := ResolveDecoded(layers[:1], layers[1:])
	if err != nil {
		t.Fatal(err)
	}
	if explicit.Sharing.DefaultMemory != nil || *explicit.Sharing.DefaultCores != 40 || explicit.Sharing.Strategy != SharingHAMiCore {
		t.Errorf("explicit = %+v, want only strategy HAMiCore and 40 cores set", explicit.Sharing)
	}
	if resolved.Sharing.DefaultMemory == nil || resolved.Sharing.DefaultMemory.String() != DefaultShareMemory || *resolved.Sharing.DefaultCores != 40 {
		t.Errorf("resolved = %+v, want the 4Gi default memory and the explicit 40 cores", resolved.Sharing)
	}
	if _, err := DecodeLayers([]byte("kind: GpuConfig\n"), []byte("{}")); err == nil || !strings.Contains(err.Error(), "configuration layer 0") {
		t.Errorf("DecodeLayers error %v, want one naming layer 0", err)
	}
}

// raw turns YAML documents into configuration layers.
func raw(docs []string) [][]byte {
	out := make([][]byte, len(docs))
	for i, d := range docs {
		out[i] = []byte(d)
	}
	return out
}
