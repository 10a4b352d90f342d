package controller

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// cdGangPod creates a gated pod of a label gang with a claim of gpus
// whole GPUs and, with channel set, a second claim (<name>-cd) for a
// ComputeDomain channel.
func (h *harness) cdGangPod(name, gangName string, size, gpus int, channel bool, extra map[string]string) {
	h.t.Helper()
	h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", int64(gpus))}})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{gangs.LabelGang: gangName, gangs.LabelSize: strconv.Itoa(size)}},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if channel {
		h.claim(name+"-cd", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ChannelRequest()}})
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "channel", ResourceClaimName: ptr.To(name + "-cd")})
	}
	for k, v := range extra {
		p.Labels[k] = v
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// cdNode is cliqueNode with the slice NVIDIA's compute-domain kubelet
// plugin publishes (one channel and the daemon device).
func cdNode(t *testing.T, name, label, published string) []runtime.Object {
	t.Helper()
	return append(cliqueNode(t, name, label, published), controllertest.ComputeDomainSlice(name, 1))
}

func cdObjects(t *testing.T) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, c := range controllertest.ComputeDomainClasses() {
		out = append(out, c)
	}
	return out
}

// TestGangComputeDomainOneClique: a gang whose pods claim a ComputeDomain
// channel is placed in one NVLink clique although it names no level (and
// although it names a Preferred leaf): while no clique has room it waits
// with an event naming the channel, where a gang without one is placed
// across cliques; the channel claims are left to kube-scheduler.
func TestGangComputeDomainOneClique(t *testing.T) {
	h := newHarness(t, objs(classes(), cdObjects(t),
		cdNode(t, "a", cliqueX, ""), cdNode(t, "b", cliqueX, ""),
		cdNode(t, "c", "", cliqueY), cdNode(t, "d", "", cliqueY))...).start()
	// Each clique keeps one free node.
	h.singletonOn("sa", "a", 4)
	h.singletonOn("sc", "c", 4)

	pref := map[string]string{gangs.LabelLevel: "leaf", gangs.LabelPolicy: "Preferred"}
	h.cdGangPod("p0", "cd", 2, 4, true, pref)
	h.cdGangPod("p1", "cd", 2, 4, true, pref)
	e := h.waitEventWith(ns+"/p0", report.ReasonGangWaiting, "only 1 fit in one clique")
	if !contains(e.Note, "ComputeDomain channel p0-cd") && !contains(e.Note, "ComputeDomain channel p1-cd") {
		t.Errorf("waiting event %q does not name the ComputeDomain channel", e.Note)
	}
	h.settle()
	if nodes := h.allocatedNodes("p0", "p1"); nodes["p0"] != "" || nodes["p1"] != "" {
		t.Fatalf("ComputeDomain gang allocated on %v across cliques", nodes)
	}

	// The same gang without channels spans the two cliques.
	h.cdGangPod("q0", "plain", 2, 4, false, nil)
	h.cdGangPod("q1", "plain", 2, 4, false, nil)
	h.waitUngated("q0")
	h.waitUngated("q1")
	if nodes := h.allocatedNodes("q0", "q1"); !samePair(nodes["q0"], nodes["q1"], "b", "d") {
		t.Fatalf("gang without a ComputeDomain on %v, want b and d", nodes)
	}
	for _, name := range []string{"q0", "q1", "sc"} {
		if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.ctrl.enqueueWaiting()
	h.waitUngated("p0")
	h.waitUngated("p1")
	nodes := h.allocatedNodes("p0", "p1")
	if !samePair(nodes["p0"], nodes["p1"], "c", "d") {
		t.Errorf("ComputeDomain gang on %v, want c and d (clique Y, the only one with 2 free nodes)", nodes)
	}
	for _, name := range []string{"p0-cd", "p1-cd"} {
		c := h.getClaim(name)
		if c.Status.Allocation != nil || len(c.Finalizers) > 0 {
			t.Errorf("channel claim %s touched by gpulink: allocation %v, finalizers %v", name, c.Status.Allocation, c.Finalizers)
		}
	}
}

// TestGangComputeDomainNeedsCliqueLevel: without a clique level in the
// hierarchy a ComputeDomain gang cannot be kept in one clique: it waits
// with an event saying so.
func TestGangComputeDomainNeedsCliqueLevel(t *testing.T) {
	hier, err := gang.NewHierarchyFromKeys([]string{gang.LabelLeaf})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{Hierarchy: hier}},
		objs(classes(), cdObjects(t), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
	h.cdGangPod("p0", "cd", 2, 4, true, nil)
	h.cdGangPod("p1", "cd", 2, 4, true, nil)
	e := h.waitEventWith(ns+"/p0", report.ReasonGangWaiting, "has no "+gang.LabelClique+" level")
	if !contains(e.Note, "claims a ComputeDomain channel") {
		t.Errorf("event %q, want it to name the ComputeDomain channel", e.Note)
	}
	h.settle()
	if nodes := h.allocatedNodes("p0", "p1"); nodes["p0"] != "" || nodes["p1"] != "" {
		t.Errorf("gang allocated on %v without a clique level", nodes)
	}
}

// TestComputeDomainInGpulinkClaimRefused: a claim asking for gpulink GPUs
// and a ComputeDomain channel together is refused with an event saying
// to claim the channel apart; gpulink never allocates the channel.
func TestComputeDomainInGpulinkClaimRefused(t *testing.T) {
	h := newHarness(t, objs(classes(), cdObjects(t), leafNode(t, "a", "l1"))...).start()
	h.claim("mixed", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1), controllertest.ChannelRequest()}})
	h.pod("mixed", true, "mixed")
	e := h.waitEvent(ns+"/mixed", report.ReasonUninterpretable)
	if !contains(e.Note, "ComputeDomain channel devices") || !contains(e.Note, "claim of its own") {
		t.Errorf("event %q, want it to refuse the ComputeDomain channel in a gpulink claim", e.Note)
	}
	if c := h.getClaim("mixed"); c.Status.Allocation != nil {
		t.Errorf("mixed claim allocated: %v", c.Status.Allocation)
	}
}

// TestGangComputeDomainChannelPerNode: kube-scheduler gives each pod of a
// ComputeDomain its node's channel-0, which one claim holds at a time, so
// a node holds one pod of such a gang, and none while another claim holds
// its channel, however many GPUs it has free. A gang of 2 pods × 2 GPUs
// (two would fit on one 4-GPU node) waits while no clique has two nodes
// with a free channel, and is then placed one pod per node.
func TestGangComputeDomainChannelPerNode(t *testing.T) {
	h := newHarness(t, objs(classes(), cdObjects(t),
		cdNode(t, "a", "", cliqueX), cdNode(t, "b", "", cliqueX), cdNode(t, "c", "", cliqueY))...).start()
	// Another ComputeDomain's pod holds a's channel (kube-scheduler
	// allocated it).
	h.claim("held", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ChannelRequest()}})
	held := h.getClaim("held")
	held.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "channel", Driver: controllertest.ComputeDomainDriver, Pool: "a", Device: "channel-0"}}}}
	if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, held, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	h.cdGangPod("p0", "cd", 2, 2, true, nil)
	h.cdGangPod("p1", "cd", 2, 2, true, nil)
	h.waitEventWith(ns+"/p0", report.ReasonGangWaiting, "only 1 fit in one clique")
	h.settle()
	if nodes := h.allocatedNodes("p0", "p1"); nodes["p0"] != "" || nodes["p1"] != "" {
		t.Fatalf("ComputeDomain gang allocated on %v, beyond the free channels of its nodes", nodes)
	}

	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.ctrl.enqueueWaiting()
	h.waitUngated("p0")
	h.waitUngated("p1")
	if nodes := h.allocatedNodes("p0", "p1"); !samePair(nodes["p0"], nodes["p1"], "a", "b") {
		t.Errorf("ComputeDomain gang on %v, want one pod on each of a and b (one channel per node)", nodes)
	}
}
