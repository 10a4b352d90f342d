package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// mpsPod creates a gated pod whose container (and, with initUser, init
// container) uses the claim, running as the given users (nil: not set),
// next to a container of yet another user that does not use the claim.
func (h *harness) mpsPod(name, claim string, user, initUser *int64) *corev1.Pod {
	h.t.Helper()
	c := func(n string, u *int64) corev1.Container {
		ctr := corev1.Container{Name: n, Image: "x", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}
		if u != nil {
			ctr.SecurityContext = &corev1.SecurityContext{RunAsUser: u}
		}
		return ctr
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
			Containers:      []corev1.Container{c("main", user), {Name: "sidecar-without-gpu", Image: "x", SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](4242)}}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if initUser != nil {
		p.Spec.InitContainers = []corev1.Container{c("init", initUser)}
	}
	out, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// TestMPSClaimOfSeveralUsersStaysGated: the controller, from its pod
// cache, keeps a pod gated while its containers would share an MPS claim
// with containers of another user (the check the kubelet plugin made by
// reading pods before; no GPU node reads pods now). Whole GPUs, pods that
// are gone and containers that do not use the claim do not count.
func TestMPSClaimOfSeveralUsersStaysGated(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	share := func(name string) {
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}})
	}

	share("mixed")
	h.mpsPod("a", "mixed", ptr.To[int64](1000), nil)
	h.waitAllocated("mixed")
	h.waitUngated("a")
	h.mpsPod("b", "mixed", ptr.To[int64](0), nil)
	e := h.waitEvent(ns+"/b", report.ReasonMPSUsersDiffer)
	for _, want := range []string{"user 0 (b/main)", "user 1000 (a/main)", "runAsUser", "claim mixed"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
	if gateIndex(h.getPod("b")) < 0 {
		t.Error("pod b of user 0 was ungated onto an MPS claim of user 1000")
	}
	// The same user joins.
	h.mpsPod("c", "mixed", ptr.To[int64](1000), nil)
	h.waitUngated("c")
	// Once the other user's pods are gone, b may join.
	for _, p := range []string{"a", "c"} {
		if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.waitUngated("b")

	// An init container counts too.
	share("init-mixed")
	h.mpsPod("d", "init-mixed", ptr.To[int64](1000), nil)
	h.waitUngated("d")
	h.mpsPod("e", "init-mixed", ptr.To[int64](1000), ptr.To[int64](2000))
	if e := h.waitEvent(ns+"/e", report.ReasonMPSUsersDiffer); !strings.Contains(e.Note, "e/init") {
		t.Errorf("event %q does not name the init container", e.Note)
	}

	// A pod whose containers disagree among themselves is refused before
	// anything is allocated.
	share("self-mixed")
	h.mpsPod("f", "self-mixed", ptr.To[int64](1), ptr.To[int64](2))
	h.waitEvent(ns+"/f", report.ReasonMPSUsersDiffer)
	if c := h.getClaim("self-mixed"); c.Status.Allocation != nil {
		t.Error("claim of a pod whose containers run as two users was allocated")
	}

	// Whole GPUs have no MPS server to wait for: any users.
	h.claim("whole", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.mpsPod("g", "whole", ptr.To[int64](1), nil)
	h.waitUngated("g")
	h.mpsPod("h", "whole", ptr.To[int64](2), nil)
	h.waitUngated("h")
}
