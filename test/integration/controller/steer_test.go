//go:build integration

package controller_test

import (
	"fmt"
	"slices"
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

// hasTaint tells whether the node carries taint (key and effect).
func (e *env) hasTaint(name string, taint corev1.Taint) bool {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.MatchTaint(&taint) })
}

// steered tells whether the node carries the steering taint.
func (e *env) steered(name string) bool { return e.hasTaint(name, steer.Taint) }

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
	// The metric counts a write once the API server answered it, which
	// may be after the taint is seen.
	e.poll("three additions counted", 10*time.Second, func() bool {
		return testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues(steer.TaintKey, "add")) >= 3
	})
	added := testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues(steer.TaintKey, "add"))
	removed := testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues(steer.TaintKey, "remove"))
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
		return testutil.ToFloat64(off.SteerTaintWrites.WithLabelValues(steer.TaintKey, "remove")) >= 2
	})
	if a := testutil.ToFloat64(off.SteerTaintWrites.WithLabelValues(steer.TaintKey, "add")); a != 0 {
		t.Errorf("%v taints added with the mode off", a)
	}
}

// scarceSteered tells whether the node carries the second steering taint.
func (e *env) scarceSteered(name string) bool { return e.hasTaint(name, steer.ScarceTaint) }

// gpuNodeWithCPU adds an API-only 8-GPU node (DGX-1 V100 links) with the
// given allocatable CPUs.
func (e *env) gpuNodeWithCPU(name, cpu string) {
	e.t.Helper()
	node := controllertest.Node(name)
	node.Status.Capacity[corev1.ResourceCPU] = resource.MustParse(cpu)
	node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
	e.addNodeWith(name, fixture(e.t, "dgx1-v100.txt"), node)
}

// Sixteen 8-GPU nodes with 96 CPUs and two with 128, stock
// kube-scheduler, --steer-cpu-pods=taint with --steer-scarce-nodes. A pod
// asking for 8 GPUs and 120 CPUs fits only the two large nodes and takes
// one; the demand mix then weighs its shape as scarce (the one idle node
// that can run it holds 8 of the 136 unallocated GPUs, 1/17), and the
// controller adds the second taint to that node alone. Ungated pods of
// 10 CPUs without claims, which kube-scheduler's spreading alone would
// send to the large idle node (LeastAllocated and BalancedAllocation
// favour the most CPUs), go to the small nodes, which carry one of
// gpulink's taints where it carries two; a pod tolerating both goes to
// it. Restarted without --steer-scarce-nodes, the controller removes the
// second taints and keeps the first.
func TestSteerScarceNodes(t *testing.T) {
	e := setup(t, map[string]string{})
	var nodes, small []string
	for i := range 16 {
		n := e.node(fmt.Sprintf("small-%d", i))
		e.gpuNodeWithCPU(n, "96")
		nodes, small = append(nodes, n), append(small, n)
	}
	bigs := []string{e.node("big-a"), e.node("big-b")}
	for _, n := range bigs {
		e.gpuNodeWithCPU(n, "128")
		nodes = append(nodes, n)
	}
	metrics := controller.NewMetrics(nil)
	e.configure = func(c *controller.Config) {
		c.RankByStranding, c.SteerCPUPods, c.SteerScarceNodes, c.Metrics = true, steer.ModeTaint, true, metrics
	}
	r := e.startController(2)
	e.poll("every GPU node tainted", time.Minute, func() bool {
		for _, n := range nodes {
			if !e.steered(n) {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if e.scarceSteered(n) {
			t.Fatalf("node %s carries the second taint before any GPU pod shape is known", n)
		}
	}

	e.template("eight", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}})
	gpuPod := e.newPod("gpu", true, "eight")
	gpuPod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("120")}
	full := e.startBound(gpuPod, time.Minute).Spec.NodeName
	spare := map[string]string{bigs[0]: bigs[1], bigs[1]: bigs[0]}[full]
	if spare == "" {
		t.Fatalf("the 8-GPU 120-CPU pod bound to %s, want one of %v", full, bigs)
	}
	e.poll("the second taint on "+spare, time.Minute, func() bool { return e.scarceSteered(spare) })
	e.poll("the second taint's addition counted", 10*time.Second, func() bool {
		return testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues(steer.ScarceTaintKey, "add")) >= 1
	})
	for _, n := range append([]string{full}, small...) {
		if e.scarceSteered(n) {
			t.Errorf("node %s carries the second taint; only %s is idle with 120 CPUs", n, spare)
		}
	}

	for i := range 3 {
		p := e.cpuOnlyPod(fmt.Sprintf("cpu-%d", i), nodes)
		p.Spec.SchedulingGates = nil
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10")}
		if b := e.startBound(p, time.Minute); !slices.Contains(small, b.Spec.NodeName) {
			t.Errorf("pod %s bound to %s, want a small node (one of gpulink's taints, where %s has two and %s no room)", p.Name, b.Spec.NodeName, spare, full)
		}
	}
	tol := e.cpuOnlyPod("tolerates", nodes)
	tol.Spec.SchedulingGates = nil
	tol.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10")}
	tol.Spec.Tolerations = []corev1.Toleration{
		{Key: steer.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: steer.ScarceTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectPreferNoSchedule}}
	if b := e.startBound(tol, time.Minute); b.Spec.NodeName != spare {
		t.Errorf("pod tolerating both taints bound to %s, want %s (kube-scheduler's spreading prefers the most CPUs)", b.Spec.NodeName, spare)
	}
	added := testutil.ToFloat64(metrics.SteerTaintWrites.WithLabelValues(steer.ScarceTaintKey, "add"))
	t.Logf("node patches of the second taint: %v added", added)
	if added != 1 {
		t.Errorf("second taint added %v times, want 1", added)
	}
	r.stop()

	off := controller.NewMetrics(nil)
	e.configure = func(c *controller.Config) {
		c.RankByStranding, c.SteerCPUPods, c.SteerScarceNodes, c.Metrics = true, steer.ModeTaint, false, off
	}
	r = e.startController(2)
	defer r.stop()
	e.poll("the second taint removed without --steer-scarce-nodes", time.Minute, func() bool { return !e.scarceSteered(spare) })
	if !e.steered(spare) {
		t.Errorf("%s lost the first taint, which stays on", spare)
	}
	if a := testutil.ToFloat64(off.SteerTaintWrites.WithLabelValues(steer.ScarceTaintKey, "add")); a != 0 {
		t.Errorf("%v second taints added with it off", a)
	}
}
