package controller

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// onDevice pins a share request to one GPU by its index attribute.
func onDevice(r resourceapi.DeviceRequest, index int) resourceapi.DeviceRequest {
	r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes["%s"].%s == %d`, driver.Name, driver.AttrIndex, index)}}}
	return r
}

// HAMi's DRA demo claim double-gpu-0 asks two MPS shares, 30 % and 60 % of
// the cores. The claim's one MPS server has one active thread percentage,
// so the kubelet plugin cannot prepare them on two GPUs; on one GPU they
// are 90 % of it, which it can. Before, the controller put them where it
// liked and the pod then waited in ContainerCreating forever (issue 18).
func TestMPSSharesOfDifferentCoresStayPreparable(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "node", "pcie-4.txt"))...).start()
	h.claim("double", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		controllertest.ShareRequest("a", "4Gi", "30"), controllertest.ShareRequest("b", "8Gi", "60")}})
	h.pod("pod-double", true, "double")
	held, ok, err := gpuview.ClaimDevices(h.waitAllocated("double"))
	if err != nil || !ok {
		t.Fatalf("claim double: %+v %v %v", held, ok, err)
	}
	if len(held.Devices) != 2 || held.Devices[0] != held.Devices[1] {
		t.Errorf("the 30 %% and 60 %% MPS shares are on %v, want one GPU", held.Devices)
	}

	// Pinned to two GPUs, the claim cannot be prepared anywhere: it waits
	// and the event says why.
	h.claim("pinned", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		onDevice(controllertest.ShareRequest("a", "1Gi", "30"), 2), onDevice(controllertest.ShareRequest("b", "1Gi", "60"), 3)}})
	h.pod("pod-pinned", true, "pinned")
	e := h.waitEvent(ns+"/pod-pinned", report.ReasonWaiting)
	for _, want := range []string{"30% of the cores of device gpu-2", "60% of device gpu-3", "one active thread percentage", "HAMiCore"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("waiting event %q lacks %q", e.Note, want)
		}
	}
	if c := h.getClaim("pinned"); c.Status.Allocation != nil {
		t.Errorf("claim pinned allocated %+v, want it left unallocated", c.Status.Allocation.Devices.Results)
	}

	// Equal cores on two GPUs are fine, and so is a whole GPU beside an
	// MPS share (the plugin gives each request its own view).
	h.claim("equal", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		onDevice(controllertest.ShareRequest("a", "1Gi", "30"), 2), onDevice(controllertest.ShareRequest("b", "1Gi", "30"), 3)}})
	h.pod("pod-equal", true, "equal")
	h.waitAllocated("equal")
	h.claim("mixed", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		controllertest.WholeRequest("ts-gpu", 1), controllertest.ShareRequest("mps-gpu", "1Gi", "50")}})
	h.pod("pod-mixed", true, "mixed")
	h.waitAllocated("mixed")
}

// With 60 % of one GPU taken, the 30 % share alone would pack onto it and
// the 60 % one go elsewhere; the claim is placed again with both on one
// GPU (HAMi's DRA demo, where pod-0 and pod-tpl-1 come first).
func TestMPSSharesPlacedTogetherWhenPackingSplitsThem(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "node", "pcie-4.txt"))...).start()
	h.claim("first", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{onDevice(controllertest.ShareRequest("a", "1Gi", "60"), 1)}})
	h.pod("pod-first", true, "first")
	h.waitAllocated("first")
	h.claim("second", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		controllertest.ShareRequest("a", "4Gi", "30"), controllertest.ShareRequest("b", "8Gi", "60")}})
	h.pod("pod-second", true, "second")
	held, ok, err := gpuview.ClaimDevices(h.waitAllocated("second"))
	if err != nil || !ok {
		t.Fatalf("claim second: %+v %v %v", held, ok, err)
	}
	if len(held.Devices) != 2 || held.Devices[0] != held.Devices[1] || held.Devices[0] == "gpu-1" {
		t.Errorf("the 30 %% and 60 %% MPS shares are on %v, want one GPU other than gpu-1", held.Devices)
	}

}
