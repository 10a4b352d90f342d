package controller

import (
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// claimWrites counts the controller's writes to claims: metadata updates
// (the finalizer) and status updates.
type claimWrites struct {
	mu                    sync.Mutex
	update, status, gates int
}

func countClaimWrites(h *harness) *claimWrites {
	w := &claimWrites{}
	h.client.PrependReactor("update", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if a.GetSubresource() == "status" {
			w.status++
		} else {
			w.update++
		}
		return false, nil, nil
	})
	h.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.gates++
		return false, nil, nil
	})
	return w
}

// claimWithFinalizer creates a claim as the chart's MutatingAdmissionPolicy
// leaves it: carrying gpulink's finalizer from the start.
func (h *harness) claimWithFinalizer(name string, spec resourceapi.DeviceClaim) {
	h.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
		Spec: resourceapi.ResourceClaimSpec{Devices: spec}}
	if _, err := h.client.ResourceV1().ResourceClaims(ns).Create(h.ctx, c, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// With the finalizer set at admission, an allocation is one claim write
// (status) plus the gate; without it, the controller still adds the
// finalizer itself first.
func TestAllocationWithFinalizerFromAdmission(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...)
	writes := countClaimWrites(h)
	h.start()
	// The pod first, as with a claim from a template: a claim no pod
	// uses yet loses the finalizer (see the next test).
	h.pod("p", true, "pre")
	h.claimWithFinalizer("pre", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.waitAllocated("pre")
	h.waitUngated("p")
	writes.mu.Lock()
	if writes.update != 0 || writes.status != 1 || writes.gates != 1 {
		t.Errorf("claim with the finalizer from admission: %d metadata, %d status and %d pod writes, want 0, 1 and 1", writes.update, writes.status, writes.gates)
	}
	writes.update, writes.status, writes.gates = 0, 0, 0
	writes.mu.Unlock()
	if !hasFinalizer(h.getClaim("pre")) {
		t.Error("finalizer gone from an allocated claim")
	}

	h.claim("plain", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("q", true, "plain")
	c := h.waitAllocated("plain")
	h.waitUngated("q")
	writes.mu.Lock()
	defer writes.mu.Unlock()
	if !hasFinalizer(c) || writes.update != 1 || writes.status != 1 || writes.gates != 1 {
		t.Errorf("claim without the policy's finalizer: finalizer %v, %d metadata, %d status and %d pod writes, want it added in 1, 1 and 1", c.Finalizers, writes.update, writes.status, writes.gates)
	}
}

// Claims the controller will never allocate lose the finalizer the
// admission policy gave them by class name: a claim whose class turns out
// to select another driver's devices, and a gpulink claim no pod uses.
func TestFinalizerRemovedFromClaimsNeverAllocated(t *testing.T) {
	// A class named like a gpulink class in the policy's list, but
	// selecting another driver's devices.
	other := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}}
	h := newHarness(t, objs(classes(), []runtime.Object{other}, gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.pod("p", true, "nic")
	h.claimWithFinalizer("nic", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "n", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "nic.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}})
	h.waitUngated("p")
	h.eventually("finalizer removed from the claim with no gpulink request", func() bool { return !hasFinalizer(h.getClaim("nic")) })

	h.claimWithFinalizer("unused", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.eventually("finalizer removed from the gpulink claim no pod uses", func() bool { return !hasFinalizer(h.getClaim("unused")) })
	if c := h.getClaim("unused"); c.Status.Allocation != nil {
		t.Errorf("unused claim allocated: %+v", c.Status.Allocation)
	}
}
