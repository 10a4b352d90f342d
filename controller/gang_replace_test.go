package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestGangPodRefusedAfterUngating: kube-scheduler binds one pod of a gang
// Required in one leaf and refuses the other, deallocating its claim. The
// refused pod is placed again on its own within the leaf its bound pod
// runs in (the free node of leaf l1), not on the other leaf's half-free
// node, which alone it fits tighter, with an event saying so; the bound
// pod is not touched.
func TestGangPodRefusedAfterUngating(t *testing.T) {
	h, nodes := placeLeafGang(t, "a", "b", "c")
	if nodes["r0"] == "d" || nodes["r1"] == "d" {
		t.Fatalf("gang Required in one leaf on %v", nodes)
	}
	// kube-scheduler binds r0 and refuses r1 on its node: its DRA plugin
	// deallocates r1's claim.
	h.bind("r0", nodes["r0"])
	h.deallocate("r1")
	free := ""
	for _, n := range []string{"a", "b", "c"} {
		if n != nodes["r0"] && n != nodes["r1"] {
			free = n
		}
	}
	h.eventually("r1 allocated again", func() bool { return allocatedNode(h.getClaim("r1")) != "" })
	if got := allocatedNode(h.getClaim("r1")); got != free {
		t.Errorf("refused gang pod placed again on %s, want %s (the free node of leaf l1; %s was refused)", got, free, nodes["r1"])
	}
	e := h.waitEvent(ns+"/r1", report.ReasonGangPodReplaced)
	if !contains(e.Note, "within the leaf") || !contains(e.Note, "not moved") {
		t.Errorf("event %q, want it to say the pod is placed again within the leaf", e.Note)
	}
	if got := allocatedNode(h.getClaim("r0")); got != nodes["r0"] {
		t.Errorf("bound pod's claim moved from %s to %q", nodes["r0"], got)
	}
}

// leafGangCluster is placeLeafGang's cluster: 4-GPU nodes l1 in leaf l1,
// and an 8-GPU node d in leaf l2 with 4 GPUs taken, the tightest fit for
// a lone 4-GPU pod.
func leafGangCluster(t *testing.T, l1 ...string) *harness {
	big := gpuNode(t, "d", "pcie-switch-8.txt")
	big[0].(*corev1.Node).Labels = map[string]string{corev1.LabelHostname: "d", gang.LabelLeaf: "l2"}
	groups := [][]runtime.Object{classes(), {big[0], big[1]}}
	for _, n := range l1 {
		groups = append(groups, leafNode(t, n, "l1"))
	}
	h := newHarness(t, objs(groups...)...).start()
	h.singletonOn("sd", "d", 4)
	return h
}

// placeLeafGang places a gang "run" of 2 pods × 4 GPUs (r0, r1) Required
// in one leaf on leafGangCluster's cluster, and returns the harness and
// the nodes the two pods were allocated. A test may refuse a pod at once:
// the controller's pod informer may not show it ungated yet, which the
// controller handles (TestGangRefusedBeforeControllerSeesUngate).
func placeLeafGang(t *testing.T, l1 ...string) (*harness, map[string]string) {
	return placeLeafGangWith(t, map[string]string{gangs.LabelLevel: "leaf"}, l1...)
}

// placeLeafGangWith is placeLeafGang with the gang's level and policy
// labels given (labels).
func placeLeafGangWith(t *testing.T, labels map[string]string, l1 ...string) (*harness, map[string]string) {
	h := leafGangCluster(t, l1...)
	h.gangPod("r0", "run", 2, 4, labels)
	h.gangPod("r1", "run", 2, 4, labels)
	h.waitUngated("r0")
	h.waitUngated("r1")
	return h, h.allocatedNodes("r0", "r1")
}

// waitControllerSeesPlaced waits until the controller's own caches show
// the pods ungated and their claims (named after them) allocated, with no
// write of its own in flight.
func (h *harness) waitControllerSeesPlaced(names ...string) {
	h.t.Helper()
	h.eventually("the controller sees "+strings.Join(names, ", ")+" ungated and allocated", func() bool {
		for _, name := range names {
			pod, err := h.ctrl.pods.Pods(ns).Get(name)
			if err != nil || gateIndex(pod) >= 0 {
				return false
			}
		}
		return h.controllerSeesAllocated(names...)
	})
}

// controllerSeesAllocated tells whether the controller's claim cache
// shows the claims (named after the pods) allocated, with no write of its
// own in flight.
func (h *harness) controllerSeesAllocated(names ...string) bool {
	for _, name := range names {
		claim, err := h.ctrl.claims.ResourceClaims(ns).Get(name)
		if err != nil || claim.Status.Allocation == nil || h.ctrl.ledger.InFlight(claim.UID) {
			return false
		}
	}
	return true
}

// refuseGang places placeLeafGang's gang, then has kube-scheduler refuse
// both pods (its DRA plugin deallocates their claims, one after the
// other), and returns the nodes of the first placement and of the next,
// once both are allocated again.
func refuseGang(t *testing.T, l1 ...string) (h *harness, first, again map[string]string) {
	h, first = placeLeafGang(t, l1...)
	for _, name := range []string{"r0", "r1"} {
		h.deallocate(name)
	}
	h.eventually("both allocated again", func() bool {
		return allocatedNode(h.getClaim("r0")) != "" && allocatedNode(h.getClaim("r1")) != ""
	})
	return h, first, h.allocatedNodes("r0", "r1")
}

// TestGangRefusedAsWholePlacedAgainTogether: kube-scheduler refuses every
// pod of a gang Required in one leaf (its gang scheduling refuses a whole
// PodGroup when one pod cannot be placed) and their claims are
// deallocated; no pod of the gang is bound. The gang is placed again as a
// whole, within one leaf, away from the two nodes it was refused on: not
// each pod on its own, the first on the other leaf's half-free node, which
// alone it fits tighter.
func TestGangRefusedAsWholePlacedAgainTogether(t *testing.T) {
	h, first, again := refuseGang(t, "a", "b", "c", "e")
	for _, name := range []string{"r0", "r1"} {
		if n := again[name]; n == "d" || n == first["r0"] || n == first["r1"] {
			t.Errorf("refused gang placed again on %v (first on %v), want both in leaf l1 away from the refused nodes", again, first)
		}
	}
	if again["r0"] == again["r1"] {
		t.Errorf("4-GPU pods on one 4-GPU node: %v", again)
	}
	e, ok := h.rec.find(ns+"/r1", report.ReasonGangPodReplaced)
	if !ok {
		e, ok = h.rec.find(ns+"/r0", report.ReasonGangPodReplaced)
	}
	if !ok || !contains(e.Note, "placing its 2 pods again together") || !contains(e.Note, "away from the node(s) it was refused on") {
		t.Errorf("replaced event %+v, want it to say the gang is placed again together away from the refused nodes", e)
	}
}

// TestGangRefusedFitsOnlyWhereRefused: the refused gang fits in one leaf
// only with the nodes it was refused on (l1 keeps one other node, l2 one
// half-free node): they are tried again, as for a single pod whose every
// node is excluded, and the gang is placed in l1 again rather than
// waiting for ever or split across the leaves.
func TestGangRefusedFitsOnlyWhereRefused(t *testing.T) {
	_, first, again := refuseGang(t, "a", "b", "c")
	for _, name := range []string{"r0", "r1"} {
		if again[name] == "d" {
			t.Errorf("refused gang placed again on %v (first on %v), want both in leaf l1", again, first)
		}
	}
	if again["r0"] == again["r1"] {
		t.Errorf("4-GPU pods on one 4-GPU node: %v", again)
	}
}

// TestGangRefusedWhileMateUnbound: kube-scheduler refuses one pod of a
// gang Required in one leaf while the other, allocated, is not bound yet.
// The refused pod waits (the other may be bound, or refused too) with an
// event naming it, holding nothing; once the other is bound it is placed
// again within that pod's leaf, not on the other leaf's half-free node.
func TestGangRefusedWhileMateUnbound(t *testing.T) {
	h, nodes := placeLeafGang(t, "a", "b", "c")
	h.deallocate("r1")
	h.waitEventWith(ns+"/r1", report.ReasonGangWaiting, "r0 of its gang, not bound, still hold")
	if got := allocatedNode(h.getClaim("r1")); got != "" {
		t.Fatalf("refused pod allocated again on %s while its gang's other pod is neither bound nor released", got)
	}
	h.bind("r0", nodes["r0"])
	h.eventually("r1 allocated again", func() bool { return allocatedNode(h.getClaim("r1")) != "" })
	if got := allocatedNode(h.getClaim("r1")); got == "d" || got == nodes["r0"] || got == nodes["r1"] {
		t.Errorf("refused gang pod placed again on %s, want the free node of leaf l1 (r0 on %s, r1 refused on %s)", got, nodes["r0"], nodes["r1"])
	}
}

// TestGangRefusedBeforeControllerSeesUngate: kube-scheduler refuses a pod
// of a gang before the controller's pod informer shows any of the gang's
// pods ungated (an informer lagging the API server). The controller knows
// it removed their gates: the refused pod waits for the other, unbound
// pod that holds its allocation, as it would with a current cache; the
// other pod's allocation is not rolled back as a decision left half
// written, and the refused pod is not placed again as a gated one would
// be, anywhere its gang's level fits.
func TestGangRefusedBeforeControllerSeesUngate(t *testing.T) {
	h := leafGangCluster(t, "a", "b", "c")
	// Held back from here on, sd's ungating would hold the gang's pods
	// back behind it.
	h.waitControllerSeesPlaced("sd")

	release := h.holdPodUpdates()
	req := map[string]string{gangs.LabelLevel: "leaf"}
	h.gangPod("r0", "run", 2, 4, req)
	h.gangPod("r1", "run", 2, 4, req)
	h.waitUngated("r0")
	h.waitUngated("r1")
	h.eventually("the controller's claim cache shows the gang allocated", func() bool { return h.controllerSeesAllocated("r0", "r1") })
	if pod, err := h.ctrl.pods.Pods(ns).Get("r1"); err != nil || gateIndex(pod) < 0 {
		t.Fatalf("the controller's pod cache should still show r1 gated (err %v)", err)
	}
	placed := h.allocatedNodes("r0", "r1")

	h.deallocate("r1")
	h.waitEventWith(ns+"/r1", report.ReasonGangWaiting, "r0 of its gang, not bound, still hold")
	h.settle()
	if _, ok := h.rec.find(ns+"/r0", report.ReasonGangRolledBack); ok {
		t.Error("the controller rolled back r0's allocation as a decision left half written")
	}
	if got := allocatedNode(h.getClaim("r0")); got != placed["r0"] {
		t.Errorf("r0's claim on %q, want it kept on %s", got, placed["r0"])
	}
	if got := allocatedNode(h.getClaim("r1")); got != "" {
		t.Fatalf("refused pod allocated again on %s while its gang's other pod is neither bound nor released", got)
	}

	release()
	h.bind("r0", placed["r0"])
	h.eventually("r1 allocated again", func() bool { return allocatedNode(h.getClaim("r1")) != "" })
	if got := allocatedNode(h.getClaim("r1")); got == "d" || got == placed["r0"] || got == placed["r1"] {
		t.Errorf("refused gang pod placed again on %s, want the free node of leaf l1 (r0 on %s, r1 refused on %s)", got, placed["r0"], placed["r1"])
	}
}
