//go:build integration

package controller_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestUnschedulableNodeIsReleased: the controller prefers the DGX A100
// (NVSwitch) for a pair, but that node has too little CPU for the pod, so
// kube-scheduler finds it unschedulable there and deallocates the claim
// (or, failing that, the controller releases it after the grace period).
// The controller excludes the node, allocates on the V100 node and
// kube-scheduler binds the pod there.
func TestUnschedulableNodeIsReleased(t *testing.T) {
	e := setup(t, map[string]string{"uns-v100": "v100-sxm2-8-aliyun-sccgn6.txt"})
	small := controllertest.Node("uns-a100")
	for _, l := range []corev1.ResourceList{small.Status.Capacity, small.Status.Allocatable} {
		l[corev1.ResourceCPU] = resource.MustParse("1")
	}
	e.addNodeWith("uns-a100", fixture(t, "dgx-a100.txt"), small)
	ctrl := e.startController(2)
	defer ctrl.stop()

	e.template("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	p := e.newPod("cpu-hungry", true, "pair")
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	created := e.createPod(p)
	start := time.Now()
	bound := e.waitBound("cpu-hungry", 2*time.Minute)
	if bound.Spec.NodeName != "uns-v100" {
		t.Fatalf("bound to %s, want uns-v100", bound.Spec.NodeName)
	}
	c := e.claimsOf(bound)[0]
	if nodeOf(c) != "uns-v100" {
		t.Errorf("claim allocated on %s, want uns-v100", nodeOf(c))
	}
	evs := e.events("cpu-hungry", created.UID)
	// Either kube-scheduler deallocates the claim (its DRA PostFilter) or
	// the controller releases it after the grace period; both exclude the node.
	if !hasEvent(evs, "allocation on node uns-a100 was released") && !hasEvent(evs, "released allocation on node uns-a100") {
		t.Errorf("no release event; events: %q", evs)
	}
	t.Logf("bound to %s after %s; events: %q", bound.Spec.NodeName, time.Since(start).Round(time.Millisecond), evs)
}
