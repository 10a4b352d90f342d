package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/steer"
	"github.com/gpulink/gpulink/driver/allocate"
)

func (h *harness) nodeTainted(name string) bool {
	h.t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].MatchTaint(&steer.Taint) {
			return true
		}
	}
	return false
}

func (h *harness) steerWrites(action string) float64 {
	return testutil.ToFloat64(h.ctrl.metrics.SteerTaintWrites.WithLabelValues(steer.TaintKey, action))
}

// The steering taint follows the node's idle GPUs: on both GPU nodes at
// start, off the node whose four GPUs one pod takes, back on once that
// claim is gone; never on the node without GPUs. One write per
// transition.
func TestSteerTaintFollowsAllocation(t *testing.T) {
	objs := append(classes(), gpuNode(t, "a", "pcie-4.txt")...)
	objs = append(objs, gpuNode(t, "b", "pcie-4.txt")...)
	objs = append(objs, cpuNode("cpu", "64"))
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, SteerCPUPods: steer.ModeTaint}, objs...).start()
	h.eventually("both GPU nodes tainted", func() bool { return h.nodeTainted("a") && h.nodeTainted("b") })
	if h.nodeTainted("cpu") {
		t.Error("the node without GPUs is tainted")
	}
	h.claim("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("p", true, "four")
	c := h.waitAllocated("four")
	full := c.Status.Allocation.Devices.Results[0].Pool
	other := map[string]string{"a": "b", "b": "a"}[full]
	h.eventually("the taint off the full node "+full, func() bool { return !h.nodeTainted(full) })
	if !h.nodeTainted(other) {
		t.Errorf("node %s with four idle GPUs lost its taint", other)
	}
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, "four", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the taint back on "+full, func() bool { return h.nodeTainted(full) })
	// The metric counts a write once the API server answered it.
	h.eventually("three additions counted", func() bool { return h.steerWrites(steerActionAdd) == 3 })
	if a, r := h.steerWrites(steerActionAdd), h.steerWrites(steerActionRemove); a != 3 || r != 1 {
		t.Errorf("writes: %v added, %v removed; want 3 and 1 (one per transition)", a, r)
	}
	if h.nodeTainted("cpu") {
		t.Error("the node without GPUs is tainted")
	}
}

// With the mode off the controller removes the taints a previous run
// left, touches no other taint, and adds none.
func TestSteerOffCleansUp(t *testing.T) {
	other := corev1.Taint{Key: "example.com/dedicated", Effect: corev1.TaintEffectNoSchedule}
	a := gpuNode(t, "a", "pcie-4.txt")
	a[0].(*corev1.Node).Spec.Taints = []corev1.Taint{other, steer.Taint}
	b := gpuNode(t, "b", "pcie-4.txt")
	objs := append(append(classes(), a...), b...)
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, SteerCPUPods: steer.ModeOff}, objs...).start()
	h.eventually("the removal counted", func() bool { return h.steerWrites(steerActionRemove) == 1 })
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) != 1 || !n.Spec.Taints[0].MatchTaint(&other) {
		t.Errorf("node a: taints %v, want only %v", n.Spec.Taints, other)
	}
	if h.nodeTainted("b") {
		t.Error("node b with idle GPUs tainted with the mode off")
	}
	if a, r := h.steerWrites(steerActionAdd), h.steerWrites(steerActionRemove); a != 0 || r != 1 {
		t.Errorf("writes: %v added, %v removed; want 0 and 1", a, r)
	}
}

func TestSteerModeValidated(t *testing.T) {
	_, err := New(Config{Client: fake.NewClientset(), Recorder: &testRecorder{}, SteerCPUPods: "gate",
		Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}})
	if err == nil {
		t.Error("mode gate accepted")
	}
}
