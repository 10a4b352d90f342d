package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		h, placed := placeLeafGangWith(t, pref, "a", "b", "c")
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

// TestGangReplacementEdgeHomes: a replacement is placed, and says where
// (or nothing), when its gang's placed pods give no domain to keep to: a
// gang Required at the level of the whole cluster (which requires
// nothing), and a gang whose placed pod's node object is gone.
func TestGangReplacementEdgeHomes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		level    string
		dropNode bool
		note     string
	}{
		{name: "required cluster", level: "cluster", note: "within the leaf its 1 pods placed before share"},
		{name: "placed pod's node gone", level: "leaf", dropNode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := map[string]string{gangs.LabelLevel: tc.level}
			h, placed := placeLeafGangWith(t, req, "a", "b", "c")
			h.bind("r0", placed["r0"])
			h.bind("r1", placed["r1"])
			h.deletePod("r1")
			if tc.dropNode {
				if err := h.client.CoreV1().Nodes().Delete(h.ctx, placed["r0"], metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				h.eventually("the controller sees node "+placed["r0"]+" gone", func() bool {
					_, err := h.ctrl.nodes.Get(placed["r0"])
					return err != nil
				})
			}
			h.gangPod("r2", "run", 2, 4, req)
			h.waitUngated("r2")
			e := h.waitEvent(ns+"/r2", report.ReasonGangPlaced)
			if got := allocatedNode(h.getClaim("r2")); got == "" || got == placed["r0"] || got == placed["r1"] {
				t.Fatalf("replacement on %q (gang on %v)", got, placed)
			}
			if tc.note != "" && !contains(e.Note, tc.note) {
				t.Errorf("event %q, want %q", e.Note, tc.note)
			}
			if tc.note == "" && contains(e.Note, "placed before") {
				t.Errorf("event %q names a domain of placed pods whose node is unknown", e.Note)
			}
		})
	}
}

// TestGangHomeNotes: what the events say of pods placed near their gang's
// placed pods, from the domain tried (placedNote) and the level spanned
// with them (relaxedNote).
func TestGangHomeNotes(t *testing.T) {
	c := &Controller{hierarchy: gang.DefaultHierarchy()}
	clique, _ := c.hierarchy.LevelOfKey(gang.LabelClique)
	leaf, _ := c.hierarchy.LevelOfKey(gang.LabelLeaf)
	spine, _ := c.hierarchy.LevelOfKey(gang.LabelSpine)
	top := c.hierarchy.Cluster()
	home := func(sharedLeaf string, required bool, steps ...homeStep) gangHome {
		h := gangHome{ref: "gang run", placed: 2, level: leaf, required: required, sharedAt: make([]string, top), steps: steps}
		h.sharedAt[leaf] = sharedLeaf
		return h
	}
	inClique, inLeaf, anywhere := homeStep{level: clique, nodes: []string{"a"}}, homeStep{level: leaf, nodes: []string{"a", "b"}}, homeStep{level: top}
	for _, tc := range []struct {
		name            string
		h               gangHome
		step, span      int
		placed, relaxed string
	}{
		{name: "in the clique", h: home("l1", false, inClique, inLeaf, anywhere), step: 0, span: clique,
			placed: "; within the clique its 2 pods placed before share"},
		{name: "beyond the leaf", h: home("l1", false, inClique, inLeaf, anywhere), step: 2, span: spine,
			placed:  "; no room in the leaf its 2 pods placed before share, so with them the gang spans a spine",
			relaxed: "gang run: prefers one leaf; with its 2 pods placed before, these span a spine: no leaf they share had room"},
		{name: "placed pods across leaves already", h: home("", false, anywhere), step: 0, span: top,
			relaxed: "gang run: prefers one leaf; with its 2 pods placed before, these span a cluster: they span more than one leaf already"},
		{name: "required", h: home("l1", true, inClique, inLeaf), step: 1, span: leaf,
			placed: "; within the leaf its 2 pods placed before share"},
		{name: "nothing placed", h: gangHome{level: leaf}, step: 0, span: top},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.placedNote(c, tc.step, tc.span); got != tc.placed {
				t.Errorf("placedNote = %q, want %q", got, tc.placed)
			}
			if got := tc.h.relaxedNote(c, tc.span); got != tc.relaxed {
				t.Errorf("relaxedNote = %q, want %q", got, tc.relaxed)
			}
		})
	}
}
