package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

// TestDeallocationSeenBeforeTheUngatedPod: kube-scheduler's deallocation
// of a claim can reach the controller before the update of the pod whose
// gate the controller removed (two watches, no order between them). The
// pod was handed over all the same, so the node is excluded for it; taken
// for a still gated pod, the claim was allocated on the same node again,
// and kube-scheduler deallocated it again
// (TestSchedulerDeallocationExcludesNode failed so on a loaded machine).
func TestDeallocationSeenBeforeTheUngatedPod(t *testing.T) {
	h := newHarness(t)
	close(h.done) // never started: the handler is called directly
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: ptr.To("c")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if err := h.ctrl.podIdx.Add(pod); err != nil {
		t.Fatal(err)
	}
	allocated := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "g", Driver: driver.Name, Pool: "a", Device: "gpu-0"},
			}},
		}},
	}
	deallocated := allocated.DeepCopy()
	deallocated.Status.Allocation = nil

	// Still gated as far as anyone knows: not kube-scheduler's doing.
	h.ctrl.onClaimUpdate(allocated, deallocated)
	if h.ctrl.excludedNodes(pod).Has("a") {
		t.Fatal("node a excluded for a pod still gated, which kube-scheduler cannot have tried")
	}
	// The controller removed the gate; its cache still shows it.
	if !h.ctrl.ungating.start(pod.UID) {
		t.Fatal("gate removal already under way")
	}
	h.ctrl.onClaimUpdate(allocated, deallocated)
	if !h.ctrl.excludedNodes(pod).Has("a") {
		t.Error("node a not excluded for the pod whose gate the controller removed, once kube-scheduler deallocated its claim")
	}
}

// TestDeallocationWaitsForItsHandler: an informer updates its cache
// before it calls the handlers, from a goroutine of its own. A pod decided
// in between, queued for another reason, would not yet avoid the node
// kube-scheduler refused it on, and went back there
// (TestGangPodRefusedAfterUngating failed so once in a full run). Its
// claims make it wait until the handler has reacted; the handler then
// excludes the node before it queues the pod.
func TestDeallocationWaitsForItsHandler(t *testing.T) {
	h := newHarness(t)
	close(h.done) // never started: the cache and the handlers are driven here
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, UID: uuid.NewUUID()},
		Spec:       corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: ptr.To("c")}}},
	}
	if err := h.ctrl.podIdx.Add(pod); err != nil {
		t.Fatal(err)
	}
	allocated := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns, UID: uuid.NewUUID(), ResourceVersion: "5", Finalizers: []string{driver.ClaimFinalizer}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "g", Driver: driver.Name, Pool: "a", Device: "gpu-0"},
			}},
		}},
	}
	if err := h.ctrl.claimIdx.Add(allocated); err != nil {
		t.Fatal(err)
	}
	h.ctrl.onClaim(allocated)
	deallocated := allocated.DeepCopy()
	deallocated.ResourceVersion = "6"
	deallocated.Status.Allocation = nil
	// The cache has the deallocation; the handlers have not run.
	if err := h.ctrl.claimIdx.Update(deallocated); err != nil {
		t.Fatal(err)
	}
	const waiting = "has not reacted to that yet"
	if pc := h.ctrl.collectClaims(h.ctx, pod); !strings.Contains(pc.notReady, waiting) {
		t.Fatalf("claims collected as %+v before the deallocation's handler ran: want the pod to wait", pc)
	}
	h.ctrl.onClaimUpdate(allocated, deallocated)
	if !h.ctrl.excludedNodes(pod).Has("a") {
		t.Error("node a not excluded once the deallocation's handler ran")
	}
	if pc := h.ctrl.collectClaims(h.ctx, pod); strings.Contains(pc.notReady, waiting) {
		t.Errorf("the pod still waits after the handler ran: %q", pc.notReady)
	}
}
