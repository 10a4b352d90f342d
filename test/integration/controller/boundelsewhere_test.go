//go:build integration

package controller_test

import (
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
)

// TestBoundElsewhereReported: a pod that is bound to a node its claim is
// not allocated on can never start (the kubelet plugin refuses the
// claim); on the real API server the controller says so on the pod with
// one ClaimOnOtherNode Warning naming both nodes, and leaves the claim,
// which the first pod uses, as it is. Such a pod comes from the settle's
// residual (controller/settle.go) or, as here, from spec.nodeName.
func TestBoundElsewhereReported(t *testing.T) {
	e := setup(t, map[string]string{"else-a": "pcie-4.txt", "else-b": "pcie-4.txt"})
	ctrl := e.startController(2)
	defer ctrl.stop()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: e.ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
	if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := e.newPod("first", true)
	useClaim(first, "gpu", "shared")
	bound := e.startBound(first, time.Minute)
	other := map[string]string{"else-a": "else-b", "else-b": "else-a"}[bound.Spec.NodeName]
	second := e.newPod("second", false)
	useClaim(second, "gpu", "shared")
	second.Spec.NodeName = other
	created := e.createPod(second)
	e.poll("ClaimOnOtherNode event on pod second", 30*time.Second, func() bool {
		return hasEvent(e.events("second", created.UID), report.ReasonBoundElsewhere+": pod is bound to node "+other+" but its claim shared is allocated on node "+bound.Spec.NodeName)
	})
	cl, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager's resourceclaim controller reserves an
	// allocated claim for a pod created with spec.nodeName, whatever node
	// the allocation selects; the controller changes nothing.
	if nodeOf(cl) != bound.Spec.NodeName || !slices.ContainsFunc(cl.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == bound.UID }) {
		t.Errorf("claim shared: node %s, reservedFor %v; want it still allocated on %s for pod first", nodeOf(cl), cl.Status.ReservedFor, bound.Spec.NodeName)
	}
	n := 0
	for _, ev := range e.events("second", created.UID) {
		if hasEvent([]string{ev}, report.ReasonBoundElsewhere) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d ClaimOnOtherNode events, want 1: %q", n, e.events("second", created.UID))
	}
}
