package v1alpha1

import (
	"encoding/json"
	"testing"
)

// FuzzDecode checks that no input makes the decode pipeline panic, and that
// whatever Decode accepts survives a JSON round trip.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		"",
		"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\n",
		"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\ntopology: {policy: Required, minLink: NV2}\nsharing: {strategy: MPS, defaultMemory: 4Gi, defaultCores: 25, maxSharesPerGPU: 16}\n",
		`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"defaultMemory":1e30}}`,
		`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"defaultMemory":"9999999999999999999Ei"}}`,
		"apiVersion: gpu.gpulink.dev/v1alpha1\nkind: GpuConfig\nsharing: &a {x: *a}\n",
		"[]",
		"null",
		"{",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := Decode(raw)
		if err != nil {
			if c != nil {
				t.Fatalf("Decode returned both %+v and %v", c, err)
			}
			return
		}
		again := c.DeepCopy()
		again.Default()
		_ = again.Validate()
		_ = again.RequiredLink()
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("re-encoding an accepted config: %v", err)
		}
		if _, err := Decode(out); err != nil {
			t.Fatalf("re-decoding %s (from %q): %v", out, raw, err)
		}
	})
}
