package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// TestOtherGateHoldsAllocation: a pod that Kueue (its plain-pod
// integration) still holds with its own scheduling gate gets no devices,
// with a Waiting event naming the gate; once Kueue removes its gate, the
// controller allocates and removes its own.
func TestOtherGateHoldsAllocation(t *testing.T) {
	const kueueGate = "kueue.x-k8s.io/admission"
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("two", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: ns, UID: "queued-uid", CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "two", ResourceClaimName: ptr.To("two")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: kueueGate}, {Name: driver.SchedulingGate}},
		},
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e := h.waitEvent(ns+"/queued", report.ReasonWaiting)
	if !contains(e.Note, kueueGate) {
		t.Errorf("waiting event %q does not name the gate %s", e.Note, kueueGate)
	}
	if c := h.getClaim("two"); c.Status.Allocation != nil {
		t.Fatalf("claim allocated while %s still holds the pod: %+v", kueueGate, c.Status.Allocation)
	}
	if gateIndex(h.getPod("queued")) < 0 {
		t.Fatal("gpulink's gate removed while another gate holds the pod")
	}

	// Kueue admits the pod: its gate goes, gpulink's stays.
	p = h.getPod("queued")
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
	if _, err := h.client.CoreV1().Pods(ns).Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitAllocated("two")
	h.waitUngated("queued")
}
