package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestPreferredGangPodsJoinPlacedPodsLeaf: a gang that prefers one leaf
// keeps its further pods in the leaf its placed pods share while it has
// room, although a node elsewhere is the tighter fit for a pod on its
// own (d, half used, in leaf l2): a replacement for a lost pod and a pod
// beyond minCount alike. Once the leaf is full, a replacement is placed
// elsewhere rather than waiting, with a GangLevelRelaxed event saying so.
func TestPreferredGangPodsJoinPlacedPodsLeaf(t *testing.T) {
	pref := map[string]string{gangs.LabelLevel: "leaf", gangs.LabelPolicy: string(gangs.Preferred)}
	place := func(t *testing.T) (*harness, map[string]string) {
		h := leafGangCluster(t, "a", "b", "c")
		h.gangPod("r0", "run", 2, 4, pref)
		h.gangPod("r1", "run", 2, 4, pref)
		h.waitUngated("r0")
		h.waitUngated("r1")
		placed := h.allocatedNodes("r0", "r1")
		h.bind("r0", placed["r0"])
		h.bind("r1", placed["r1"])
		return h, placed
	}
	t.Run("replacement", func(t *testing.T) {
		h, placed := place(t)
		h.deletePod("r1") // its claim keeps its node's GPUs until released
		h.gangPod("r2", "run", 2, 4, pref)
		h.waitUngated("r2")
		if got := allocatedNode(h.getClaim("r2")); got == "d" || got == placed["r0"] || got == placed["r1"] {
			t.Fatalf("replacement on %s, want the free node of leaf l1 (r0 on %s, r1 was on %s)", got, placed["r0"], placed["r1"])
		}
		if e := h.waitEvent(ns+"/r2", report.ReasonGangPlaced); !contains(e.Note, "within the leaf its 1 pods placed before share") {
			t.Errorf("replacement's event %q, want it to name the placed pods' leaf", e.Note)
		}
		if _, ok := h.rec.find(ns+"/r2", report.ReasonGangRelaxed); ok {
			t.Error("replacement in its gang's leaf got a GangLevelRelaxed event")
		}

		// l1 is full now: the next replacement goes to d, and says why.
		h.deletePod("r2")
		h.gangPod("r3", "run", 2, 4, pref)
		h.waitUngated("r3")
		if got := allocatedNode(h.getClaim("r3")); got != "d" {
			t.Fatalf("replacement on %q with leaf l1 full, want d", got)
		}
		h.waitEventWith(ns+"/r3", report.ReasonGangPlaced, "no room in the leaf its 1 pods placed before share")
		h.waitEventWith(ns+"/r3", report.ReasonGangRelaxed, "prefers one leaf; with its 1 pods placed before, these span a cluster")
	})
	t.Run("beyond minCount", func(t *testing.T) {
		h, placed := place(t)
		h.waitControllerSeesPlaced("r0", "r1")
		h.gangPod("r2", "run", 2, 4, pref)
		h.waitUngated("r2")
		if got := allocatedNode(h.getClaim("r2")); got == "d" || got == placed["r0"] || got == placed["r1"] {
			t.Errorf("further pod on %s, want the free node of leaf l1 (gang on %v)", got, placed)
		}
		if e := h.waitEvent(ns+"/r2", report.ReasonAllocated); !contains(e.Note, "within the leaf its 2 pods placed before share") {
			t.Errorf("further pod's event %q, want it to name the placed pods' leaf", e.Note)
		}
	})
}

// TestGangReplacementJoinsPlacedPodsClique: a gang Required in one leaf
// whose pods share an NVLink clique gets its replacement in that clique
// while it has room, not on the leaf's tightest node for a pod on its
// own (c, half used, in another clique of the same leaf): the gang keeps
// its NVLink links.
func TestGangReplacementJoinsPlacedPodsClique(t *testing.T) {
	node := func(name, topology, clique string) []runtime.Object {
		objs := gpuNode(t, name, topology)
		objs[0].(*corev1.Node).Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: "l1", gang.LabelClique: clique}
		return objs
	}
	h := newHarness(t, objs(classes(), node("a", "pcie-4.txt", "k1"), node("b", "pcie-4.txt", "k1"), node("x", "pcie-4.txt", "k1"),
		node("c", "pcie-switch-8.txt", "k2"))...).start()
	h.singletonOn("sc", "c", 4)
	req := map[string]string{gangs.LabelLevel: "leaf"}
	h.gangPod("r0", "run", 2, 4, req)
	h.gangPod("r1", "run", 2, 4, req)
	h.waitUngated("r0")
	h.waitUngated("r1")
	placed := h.allocatedNodes("r0", "r1")
	for _, p := range []string{"r0", "r1"} {
		if placed[p] == "c" {
			t.Fatalf("gang placed on %v, want both pods in clique k1", placed)
		}
		h.bind(p, placed[p])
	}
	h.deletePod("r1")
	h.gangPod("r2", "run", 2, 4, req)
	h.waitUngated("r2")
	free := map[string]bool{"a": true, "b": true, "x": true}
	delete(free, placed["r0"])
	delete(free, placed["r1"])
	if got := allocatedNode(h.getClaim("r2")); !free[got] {
		t.Fatalf("replacement on %q, want the free node of clique k1 %v (gang on %v)", got, free, placed)
	}
	if e := h.waitEvent(ns+"/r2", report.ReasonGangPlaced); !contains(e.Note, "within the clique its 1 pods placed before share") {
		t.Errorf("replacement's event %q, want it to name the placed pods' clique", e.Note)
	}
}

// TestGangRefusedPodNotBackOnItsNode: a gang of two 4-GPU pods Required
// in one leaf lands on one 8-GPU node, a. kube-scheduler binds r0 there
// and refuses r1. r1 is placed again near r0, but the tightest domain
// they share, node a, is the node r1 was refused on: it goes to b, the
// rest of the leaf, not back to a (the refused node is tried again only
// when nothing else fits, as for any pod).
func TestGangRefusedPodNotBackOnItsNode(t *testing.T) {
	node := func(name string) []runtime.Object {
		objs := gpuNode(t, name, "pcie-switch-8.txt")
		objs[0].(*corev1.Node).Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: "l1"}
		return objs
	}
	h := newHarness(t, objs(classes(), node("a"), node("b"))...).start()
	req := map[string]string{gangs.LabelLevel: "leaf"}
	h.gangPod("r0", "run", 2, 4, req)
	h.gangPod("r1", "run", 2, 4, req)
	h.waitUngated("r0")
	h.waitUngated("r1")
	placed := h.allocatedNodes("r0", "r1")
	if placed["r0"] != placed["r1"] {
		t.Fatalf("gang on %v, want both pods on one node", placed)
	}
	h.bind("r0", placed["r0"])
	h.deallocate("r1")
	h.eventually("r1 allocated again", func() bool { return allocatedNode(h.getClaim("r1")) != "" })
	if got := allocatedNode(h.getClaim("r1")); got == placed["r1"] {
		t.Errorf("refused pod placed again on %s, the node it was refused on, while the other node of its leaf is idle", got)
	}
}
