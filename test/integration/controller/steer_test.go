//go:build integration

package controller_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/steer"
)

// steered tells whether the node carries the steering taint.
func (e *env) steered(name string) bool {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].MatchTaint(&steer.Taint) {
			return true
		}
	}
	return false
}

// Two GPU nodes of four GPUs and 1,000 CPUs, stock kube-scheduler, no
// gate on pods without claims. The controller with --steer-cpu-pods=taint
// taints both; a GPU pod that asks for all four GPUs of one node ("full")
// and half its CPUs takes the taint off it. An ungated pod without claims
// then goes to "full", although kube-scheduler's spreading alone
// (LeastAllocated) prefers the idle "free": TaintToleration (weight 3)
// outweighs it. The GPU pod's end puts the taint back; a controller
// started with the mode off removes every taint. Each transition is one
// node patch.
func TestSteerCPUOnlyPodsByTaint(t *testing.T) {
	e := setup(t, map[string]string{})
	full, free := e.ns+"-full", e.ns+"-free"
	e.addNode(full, fixture(t, "pcie-4.txt"))
	e.addNode(free, fixture(t, "pcie-4.txt"))
	nodes := []string{full, free}
	metrics := controller.NewMetrics(nil)
	e.configure = func(c *controller.Config) {
		c.RankByStranding, c.SteerCPUPods, c.Metrics = true, steer.ModeTaint, metrics
	}
	r := e.startController(2)
	e.poll("both GPU nodes tainted", time.Minute, func() bool { return e.steered(full) && e.steered(free) })

	e.template("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	gpuPod := e.newPod("gpu", true, "four")
	gpuPod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: full}
	gpuPod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500")}
	if p := e.startBound(gpuPod, time.Minute); p.Spec.NodeName != full {
		t.Fatalf("GPU pod bound to %s, want %s", p.Spec.NodeName, full)
	}
	e.poll("the taint off "+full, time.Minute, func() bool { return !e.steered(full) })
	if !e.steered(free) {
		t.Fatalf("%s, with four idle GPUs, lost its taint", free)
	}

	// Ungated pods without claims, held to the test's nodes: every one to
	// the node whose GPUs are taken.
	for i := range 3 {
		p := e.cpuOnlyPod(fmt.Sprintf("cpu-%d", i), nodes)
		p.Spec.SchedulingGates = nil
		if b := e.startBound(p, time.Minute); b.Spec.NodeName != full {
			t.Errorf("pod %s bound to %s, want %s (its GPUs are all allocated; %s has four idle)", p.Name, b.Spec.NodeName, full, free)
		}
	}
	// A pod that tolerates the taint is spread as before: to the idle node.
	tol := e.cpuOnlyPod("tolerates", nodes)
	tol.Spec.SchedulingGates = nil
	tol.Spec.Tolerations = []corev1.Toleration{{Key: steer.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectPreferNoSchedule}}
	if b := e.startBound(tol, time.Minute); b.Spec.NodeName != free {
		t.Errorf("pod tolerating the taint bound to %s, want %s (LeastAllocated)", b.Spec.NodeName, free)
	}

	e.deletePod("gpu")
	e.poll("the taint back on "+full, 2*time.Minute, func() bool { return e.steered(full) })
	added := testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues("add"))
	removed := testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues("remove"))
	t.Logf("node patches of the steering taint: %v added, %v removed (1 GPU pod, 4 pods without claims)", added, removed)
	if added != 3 || removed != 1 {
		t.Errorf("node patches: %v added, %v removed; want 3 and 1, one per transition", added, removed)
	}
	r.stop()

	off := controller.NewMetrics(nil)
	e.configure = func(c *controller.Config) { c.RankByStranding, c.SteerCPUPods, c.Metrics = true, steer.ModeOff, off }
	r = e.startController(2)
	defer r.stop()
	e.poll("every taint removed with the mode off", time.Minute, func() bool { return !e.steered(full) && !e.steered(free) })
	e.poll("the removals counted", 10*time.Second, func() bool {
		return testutil.ToFloat64(off.SteerTaintWrites.WithLabelValues("remove")) >= 2
	})
	if a := testutil.ToFloat64(off.SteerTaintWrites.WithLabelValues("add")); a != 0 {
		t.Errorf("%v taints added with the mode off", a)
	}
}
