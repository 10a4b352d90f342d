package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestDecodeValid(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want GpuConfig
	}{
		{
			name: "yaml, every field",
			raw: `apiVersion: gpu.gpulink.dev/v1alpha1
kind: GpuConfig
topology:
  policy: Required
  minLink: NV2
sharing:
  strategy: HAMiCore
  defaultMemory: 10Gi
  defaultCores: 30
  maxSharesPerGPU: 8
  priority: 1
  mpsMode: Concurrent
`,
			want: GpuConfig{
				Topology: &TopologyConfig{Policy: TopologyRequired, MinLink: "NV2"},
				Sharing: &SharingConfig{
					Strategy:        SharingHAMiCore,
					DefaultMemory:   quantity("10Gi"),
					DefaultCores:    ptr(int64(30)),
					MaxSharesPerGPU: ptr(8),
					Priority:        ptr(PriorityLow),
					MPSMode:         MPSConcurrent,
				},
			},
		},
		{
			name: "json, topology only",
			raw:  `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","topology":{"policy":"BestEffort"}}`,
			want: GpuConfig{Topology: &TopologyConfig{Policy: TopologyBestEffort}},
		},
		{
			name: "identity only",
			raw:  "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n",
			want: GpuConfig{},
		},
		{
			name: "comment-only documents do not count",
			raw:  "# GPU settings\n---\napiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n---\n# end\n",
			want: GpuConfig{},
		},
		{
			// 0 is HAMi's high priority, not "unset": it must survive.
			name: "priority 0 is kept",
			raw:  `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":0}}`,
			want: GpuConfig{Sharing: &SharingConfig{Priority: ptr(PriorityHigh)}},
		},
		{
			name: "memory as plain bytes",
			raw:  `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"defaultMemory":1048576}}`,
			want: GpuConfig{Sharing: &SharingConfig{DefaultMemory: quantity("1Mi")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.raw))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.APIVersion != APIVersion || got.Kind != Kind {
				t.Errorf("type meta = %q %q, want %q %q", got.APIVersion, got.Kind, APIVersion, Kind)
			}
			assertConfigEqual(t, got, &tt.want)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	const header = "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n"
	tests := []struct {
		name string
		raw  string
		want []string // substrings the error must contain
	}{
		{"empty", "  \n", []string{"empty document"}},
		{"typo in nested field", header + "sharing:\n  maxShares: 4\n", []string{`unknown field "sharing.maxShares"`}},
		{"typo in placement", header + "placement:\n  nodes: Spread\n", []string{`unknown field "placement.nodes"`}},
		{"unknown top-level field", header + "topolgy:\n  policy: Required\n", []string{`unknown field "topolgy"`}},
		{"keys are case-sensitive", header + "sharing:\n  Strategy: MPS\n", []string{`unknown field "sharing.Strategy"`}},
		{"duplicate yaml key", header + "sharing:\n  strategy: MPS\n  strategy: None\n", []string{`"strategy" already set`}},
		{"duplicate json key", `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","kind":"GpuConfig"}`, []string{`"kind" already set`}},
		{"wrong apiVersion", "apiVersion: gpu.gpulink.dev/v1\nkind: GpuConfig\n", []string{`apiVersion: Unsupported value: "gpu.gpulink.dev/v1"`, `"gpu.gpulink.dev/v1alpha1"`}},
		{"wrong group", "apiVersion: gpu.nvidia.com/v1alpha1\nkind: GpuConfig\n", []string{`apiVersion: Unsupported value: "gpu.nvidia.com/v1alpha1"`}},
		{"wrong kind", "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GPUConfig\n", []string{`kind: Unsupported value: "GPUConfig": supported values: "GpuConfig"`}},
		{"missing apiVersion", "kind: GpuConfig\n", []string{"apiVersion: Required value"}},
		{"missing kind", "apiVersion: gpu.gpulink.dev/v1alpha1\n", []string{"kind: Required value"}},
		{"kind not a string", "apiVersion: gpu.gpulink.dev/v1alpha1\nkind: 3\n", []string{"kind: Invalid value: 3"}},
		{"not an object", "[1, 2]", []string{"must be a JSON or YAML object, got an array"}},
		{"scalar", "hello", []string{"got a string"}},
		{"two documents", header + "---\n" + header + "sharing: {strategy: None}\n", []string{"2 or more YAML documents"}},
		{"malformed yaml", header + "sharing: [\n", []string{"yaml"}},
		{"bad quantity", header + "sharing:\n  defaultMemory: lots\n", []string{`sharing.defaultMemory: Invalid value: "lots"`}},
		{"quantity of wrong type", header + "sharing:\n  defaultMemory: [1]\n", []string{"sharing.defaultMemory: Invalid value", "got an array"}},
		{"fractional cores", header + "sharing:\n  defaultCores: 2.5\n", []string{"sharing.defaultCores", "2.5"}},
		{"fractional priority", header + "sharing:\n  priority: 0.5\n", []string{"sharing.priority: Invalid value: 0.5: must be 0 (high) or 1 (low)"}},
		{"priority as a string", header + "sharing:\n  priority: high\n", []string{`sharing.priority: Invalid value: "high": must be 0 (high) or 1 (low)`}},
		{"mpsMode as a number", header + "sharing:\n  mpsMode: 1\n", []string{`sharing.mpsMode: Invalid value: 1: must be "Isolated" or "Concurrent", got a number`}},
		{"mpsMode as a boolean", header + "sharing:\n  mpsMode: true\n", []string{`sharing.mpsMode: Invalid value: true: must be "Isolated" or "Concurrent", got a boolean`}},
		{"mpsMode misspelt key", header + "sharing:\n  mpsmode: Concurrent\n", []string{`unknown field "sharing.mpsmode"`}},
		{"object where string expected", header + "topology:\n  policy: {a: 1}\n", []string{"topology.policy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.raw))
			if err == nil {
				t.Fatalf("Decode succeeded with %+v, want an error", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func quantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func ptr[T any](v T) *T { return &v }

// assertConfigEqual compares the payload of two configs, quantities by value
// (their cached string forms may differ).
func assertConfigEqual(t *testing.T, got, want *GpuConfig) {
	t.Helper()
	if (got.Topology == nil) != (want.Topology == nil) {
		t.Fatalf("topology = %+v, want %+v", got.Topology, want.Topology)
	}
	if got.Topology != nil && *got.Topology != *want.Topology {
		t.Errorf("topology = %+v, want %+v", *got.Topology, *want.Topology)
	}
	if (got.Sharing == nil) != (want.Sharing == nil) {
		t.Fatalf("sharing = %+v, want %+v", got.Sharing, want.Sharing)
	}
	if got.Sharing == nil {
		return
	}
	g, w := got.Sharing, want.Sharing
	if g.Strategy != w.Strategy {
		t.Errorf("sharing.strategy = %q, want %q", g.Strategy, w.Strategy)
	}
	switch {
	case (g.DefaultMemory == nil) != (w.DefaultMemory == nil):
		t.Errorf("sharing.defaultMemory = %v, want %v", g.DefaultMemory, w.DefaultMemory)
	case g.DefaultMemory != nil && g.DefaultMemory.Cmp(*w.DefaultMemory) != 0:
		t.Errorf("sharing.defaultMemory = %s, want %s", g.DefaultMemory, w.DefaultMemory)
	}
	assertPtrEqual(t, "sharing.defaultCores", g.DefaultCores, w.DefaultCores)
	assertPtrEqual(t, "sharing.maxSharesPerGPU", g.MaxSharesPerGPU, w.MaxSharesPerGPU)
	assertPtrEqual(t, "sharing.memoryOvercommitPercent", g.MemoryOvercommitPercent, w.MemoryOvercommitPercent)
	assertPtrEqual(t, "sharing.priority", g.Priority, w.Priority)
	if g.MPSMode != w.MPSMode {
		t.Errorf("sharing.mpsMode = %q, want %q", g.MPSMode, w.MPSMode)
	}
}

func assertPtrEqual[T comparable](t *testing.T, name string, got, want *T) {
	t.Helper()
	switch {
	case (got == nil) != (want == nil):
		t.Errorf("%s = %v, want %v", name, got, want)
	case got != nil && *got != *want:
		t.Errorf("%s = %v, want %v", name, *got, *want)
	}
}
