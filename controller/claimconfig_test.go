package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
)

// A claim's opaque config may narrow the settings that protect other
// tenants of a GPU (a lower maxSharesPerGPU, the class's own strategy) but
// not pick another strategy or raise the share cap: such claims stay gated
// with a warning naming the field and both values.
func TestClaimConfigMayOnlyNarrowTheClass(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	config := func(sharing string) []resourceapi.DeviceClaimConfiguration {
		return []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(
			`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":` + sharing + `}`)}
	}
	share := []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "2Gi", "10")}
	refused := map[string]struct {
		spec resourceapi.DeviceClaim
		want []string
	}{
		"hami": {resourceapi.DeviceClaim{Requests: share, Config: config(`{"strategy":"HAMiCore"}`)},
			[]string{"sharing.strategy", "HAMiCore", "MPS"}},
		"none": {resourceapi.DeviceClaim{Requests: share, Config: config(`{"strategy":"None"}`)},
			[]string{"sharing.strategy", "None", "MPS"}},
		"many": {resourceapi.DeviceClaim{Requests: share, Config: config(`{"maxSharesPerGPU":100}`)},
			[]string{"sharing.maxSharesPerGPU", "100", "16"}},
		// The whole-GPU class sets no strategy: the default is the
		// operator's, and a share asked for through capacity on it gets it.
		"whole-hami": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)},
			Config: config(`{"strategy":"HAMiCore"}`)}, []string{"sharing.strategy", "HAMiCore", "MPS"}},
	}
	for name, tc := range refused {
		h.claim(name, tc.spec)
		h.pod("pod-"+name, true, name)
	}
	h.claim("fewer", resourceapi.DeviceClaim{Requests: share, Config: config(`{"strategy":"MPS","maxSharesPerGPU":4}`)})
	h.pod("pod-fewer", true, "fewer")
	h.waitAllocated("fewer")
	for name, tc := range refused {
		e := h.waitEvent(ns+"/pod-"+name, report.ReasonUninterpretable)
		if e.Type != corev1.EventTypeWarning {
			t.Errorf("%s: event %+v, want a warning", name, e)
		}
		for _, w := range tc.want {
			if !contains(e.Note, w) {
				t.Errorf("%s: event note %q does not mention %q", name, e.Note, w)
			}
		}
		if h.getClaim(name).Status.Allocation != nil {
			t.Errorf("%s: claim was allocated", name)
		}
	}
}
