//go:build integration

package controller_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestNodeFitPlacesOnNextNode: the controller prefers the DGX A100
// (NVSwitch) for a pair, but that node has too little CPU for the pod.
// The node fit filter rules it out before any allocation: the claim is
// allocated on the V100 node at once and kube-scheduler binds the pod
// there, with no release and retry.
func TestNodeFitPlacesOnNextNode(t *testing.T) {
	e := setup(t, map[string]string{"fit-v100": "v100-sxm2-8-aliyun-sccgn6.txt"})
	small := controllertest.Node("fit-a100")
	for _, l := range []corev1.ResourceList{small.Status.Capacity, small.Status.Allocatable} {
		l[corev1.ResourceCPU] = resource.MustParse("1")
	}
	e.addNodeWith("fit-a100", fixture(t, "dgx-a100.txt"), small)
	ctrl := e.startController(2)
	defer ctrl.stop()

	e.template("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	p := e.newPod("cpu-hungry", true, "pair")
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
	created := e.createPod(p)
	start := time.Now()
	bound := e.waitBound("cpu-hungry", time.Minute)
	took := time.Since(start)
	if bound.Spec.NodeName != "fit-v100" {
		t.Fatalf("bound to %s, want fit-v100", bound.Spec.NodeName)
	}
	if c := e.claimsOf(bound)[0]; nodeOf(c) != "fit-v100" {
		t.Errorf("claim allocated on %s, want fit-v100", nodeOf(c))
	}
	evs := e.events("cpu-hungry", created.UID)
	if hasEvent(evs, "released") {
		t.Errorf("the allocation was released and retried; events: %q", evs)
	}
	// A pod no node has the memory for waits, and the event counts why.
	p = e.newPod("memory-hungry", true, "pair")
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Ti")}
	created = e.createPod(p)
	e.poll("waiting event", 30*time.Second, func() bool {
		return hasEvent(e.events("memory-hungry", created.UID), "0/2 nodes: 2 Insufficient memory")
	})
	t.Logf("bound to %s after %s; events: %q", bound.Spec.NodeName, took.Round(time.Millisecond), evs)
}

// TestUnschedulableNodeIsReleased: the controller prefers the DGX A100
// (NVSwitch) for a pair, but kube-scheduler cannot put the pod there for a
// reason the controller's filters do not check (the pod's local volume is
// on the V100 node: gpulink does not model volumes; host ports, which
// this test used before, it now checks), so kube-scheduler deallocates
// the claim (or, failing that, the controller releases it after the grace
// period). The node is excluded for the pod, recorded in its annotation,
// and the pod is placed on the V100 node.
func TestUnschedulableNodeIsReleased(t *testing.T) {
	e := setup(t, map[string]string{"uns-v100": "v100-sxm2-8-aliyun-sccgn6.txt", "uns-a100": "dgx-a100.txt"})
	ctrl := e.startController(2)
	defer ctrl.stop()
	const volumeLabel = "test.gpulink.dev/scratch"
	patch := []byte(`{"metadata":{"labels":{"` + volumeLabel + `":"here"}}}`)
	if _, err := e.client.CoreV1().Nodes().Patch(e.ctx, "uns-v100", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.localVolume("scratch", volumeLabel, "here")

	e.template("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	p := e.newPod("volume-user", true, "pair")
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "scratch"}}}}
	created := e.createPod(p)
	start := time.Now()
	bound := e.waitBound("volume-user", 2*time.Minute)
	if bound.Spec.NodeName != "uns-v100" {
		t.Fatalf("bound to %s, want uns-v100", bound.Spec.NodeName)
	}
	c := e.claimsOf(bound)[0]
	if nodeOf(c) != "uns-v100" {
		t.Errorf("claim allocated on %s, want uns-v100", nodeOf(c))
	}
	// Either kube-scheduler deallocates the claim (its DRA PostFilter) or
	// the controller releases it after the grace period; both exclude the node.
	// Events are recorded asynchronously, so wait for it.
	e.poll("release event on pod volume-user", 30*time.Second, func() bool {
		evs := e.events("volume-user", created.UID)
		return hasEvent(evs, "allocation on node uns-a100 was released") || hasEvent(evs, "released allocation on node uns-a100")
	})
	e.poll("exclusion recorded on the pod", 30*time.Second, func() bool {
		pod, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "volume-user", metav1.GetOptions{})
		return err == nil && pod.Annotations[controller.ExcludedNodesAnnotation] == "uns-a100"
	})
	t.Logf("bound to %s after %s; events: %q", bound.Spec.NodeName, time.Since(start).Round(time.Millisecond), e.events("volume-user", created.UID))
}
