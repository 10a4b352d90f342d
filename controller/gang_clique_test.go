package controller

import (
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

// Cliques of the tests, in the kubelet plugin's cliqueID format.
const (
	cliqueX = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.1"
	cliqueY = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.2"
)

// cliqueNode is a 4-GPU node (pcie-4.txt) whose GPUs publish the NVLink
// clique published (none when ""), with the node label
// nvidia.com/gpu.clique set to label (none when "").
func cliqueNode(t *testing.T, name, label, published string) []runtime.Object {
	t.Helper()
	topo := fixtureTopology(t, "pcie-4.txt")
	for i := range topo.GPUs {
		topo.GPUs[i].Clique = published
	}
	s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := controllertest.Node(name)
	n.Labels = map[string]string{corev1.LabelHostname: name}
	if label != "" {
		n.Labels[gang.LabelClique] = label
	}
	return []runtime.Object{n, s}
}

// singletonOn creates a pod of one claim of gpus whole GPUs pinned to
// node and waits until it is allocated there.
func (h *harness) singletonOn(name, node string, gpus int) {
	h.t.Helper()
	h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", int64(gpus))}})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}, NodeSelector: map[string]string{corev1.LabelHostname: node},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.waitUngated(name)
	if n := allocatedNode(h.getClaim(name)); n != node {
		h.t.Fatalf("singleton %s on %q, want %s", name, n, node)
	}
}

// TestGangCliqueFromPublishedAttribute: nodes without the
// nvidia.com/gpu.clique label are in the clique their GPUs publish
// (gpu.gpulink.dev/cliqueID), and a node labelled with the same value is
// in the same clique. A gang Required at the clique level waits while no
// clique has room and lands in one clique, labelled or not.
func TestGangCliqueFromPublishedAttribute(t *testing.T) {
	h := newHarness(t, objs(classes(),
		cliqueNode(t, "a", "", cliqueX), cliqueNode(t, "b", "", cliqueX),
		cliqueNode(t, "c", cliqueY, ""), cliqueNode(t, "d", "", cliqueY),
		cliqueNode(t, "e", "", ""))...).start()
	// Clique X keeps one free node, clique Y none: d is taken.
	h.singletonOn("sa", "a", 4)
	h.singletonOn("sd", "d", 4)

	req := map[string]string{gangs.LabelLevel: "clique"}
	h.gangPod("p0", "nvl", 2, 4, req)
	h.gangPod("p1", "nvl", 2, 4, req)
	h.waitEventWith(ns+"/p0", report.ReasonGangWaiting, "only 1 fit in one clique")
	h.settle()
	if nodes := h.allocatedNodes("p0", "p1"); nodes["p0"] != "" || nodes["p1"] != "" {
		t.Fatalf("gang Required in one clique allocated on %v across cliques", nodes)
	}

	// d frees up: clique Y (c labelled, d by its GPUs) has room.
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "sd", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, "sd", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.ctrl.enqueueWaiting()
	h.waitUngated("p0")
	h.waitUngated("p1")
	if nodes := h.allocatedNodes("p0", "p1"); !samePair(nodes["p0"], nodes["p1"], "c", "d") {
		t.Errorf("gang on %v, want nodes c and d (clique Y)", nodes)
	}
	e := h.waitEvent(ns+"/p0", report.ReasonGangPlaced)
	if !contains(e.Note, "clique "+cliqueY) {
		t.Errorf("placed event %q, want it to name clique %s", e.Note, cliqueY)
	}
}

// TestNodeDomainsClique: the clique level of a node comes from its label,
// else from the clique its GPUs publish; other levels from labels only.
func TestNodeDomainsClique(t *testing.T) {
	h := newHarness(t, objs(classes(),
		cliqueNode(t, "a", "", cliqueX), cliqueNode(t, "b", cliqueY, cliqueX), cliqueNode(t, "e", "", ""))...).start()
	h.eventually("inventory of 3 nodes", func() bool { return len(h.ctrl.inv.All()) == 3 })
	level, _ := h.ctrl.hierarchy.LevelOfKey(gang.LabelClique)
	for node, want := range map[string]string{"a": cliqueX, "b": cliqueY, "e": ""} {
		n, err := h.ctrl.nodes.Get(node)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.ctrl.nodeDomains(n, h.ctrl.inv.Node(node))[level-1]; got != want {
			t.Errorf("node %s: clique domain %q, want %q", node, got, want)
		}
		if got := h.ctrl.nodeDomain(n, gang.LabelClique); got != want {
			t.Errorf("node %s: nodeDomain %q, want %q", node, got, want)
		}
		if got := h.ctrl.nodeDomain(n, gang.LabelLeaf); got != "" {
			t.Errorf("node %s: leaf %q, want none", node, got)
		}
	}
}
