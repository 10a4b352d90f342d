package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// otherNode is a node outside the leaf l1 that startSoftReservation
// reserves, with 2 of its 4 GPUs taken (by pod blocker-<name>).
type otherNode struct{ name, leaf string }

// startSoftReservation starts the controller (starvation bound 10
// minutes, strict bound 2 hours) on leaf l1 (a, b; pod "old" takes 2 of
// a's 4 GPUs) and the other nodes, then creates gang "starved" of 2 pods
// × 4 GPUs (g0, g1) as if created waited ago, and returns once it reserved
// a domain, with that event.
func startSoftReservation(t *testing.T, waited time.Duration, others ...otherNode) (*harness, recordedEvent) {
	t.Helper()
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{StarvationBound: 10 * time.Minute, StrictReservationBound: 2 * time.Hour}}
	nodes := [][]runtime.Object{classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1")}
	for _, o := range others {
		nodes = append(nodes, leafNode(t, o.name, o.leaf))
	}
	h := newHarnessWith(t, cfg, objs(nodes...)...).start()
	h.singletonOn("old", "a", 2)
	for _, o := range others {
		h.singletonOn("blocker-"+o.name, o.name, 2)
	}
	h.backdatedGang("g", "starved", 2, 4, waited, nil)
	return h, h.waitEvent(ns+"/g0", report.ReasonGangReserved)
}

// TestGangSoftReservation: leaf l1 (a, b) is reserved for a gang of 2
// pods × 4 GPUs that waited past the starvation bound; leaf l2 (c) has 2
// GPUs free. While the reservation is soft, a 2-GPU singleton that fits
// on c goes there and not onto the reserved leaf, and a 4-GPU pod
// (a singleton, or the one pod of another gang) that fits nowhere but the
// reserved node b is placed there. Once the starved gang has waited past
// the strict bound, that pod waits, its event naming the reservation.
func TestGangSoftReservation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		waited time.Duration // since the gang's pods were created
		strict bool
		gang   bool // the 4-GPU pod is a gang of its own
	}{
		{"soft", time.Hour, false, false},
		{"soft gang", time.Hour, false, true},
		{"strict", 3 * time.Hour, true, false},
		{"strict gang", 3 * time.Hour, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, e := startSoftReservation(t, tc.waited, otherNode{"c", "l2"})
			if !contains(e.Note, "reserving leaf l1") {
				t.Fatalf("reservation event %q, want leaf l1", e.Note)
			}
			if soft := contains(e.Note, "only pods that fit nowhere else"); soft == tc.strict {
				t.Errorf("reservation event %q: soft %v, want %v", e.Note, soft, !tc.strict)
			}

			h.claim("late2", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
			h.pod("late2", true, "late2")
			h.waitUngated("late2")
			if n := allocatedNode(h.getClaim("late2")); n != "c" {
				t.Errorf("2-GPU singleton on %s, want c: it fits outside the reserved leaf", n)
			}

			waiting := report.ReasonWaiting
			if tc.gang {
				h.gangPod("late4", "late", 1, 4, nil)
				waiting = report.ReasonGangWaiting
			} else {
				h.claim("late4", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
				h.pod("late4", true, "late4")
			}
			if tc.strict {
				w := h.waitEvent(ns+"/late4", waiting)
				if !contains(w.Note, "reserved") {
					t.Errorf("4-GPU pod's waiting event %q, want it to name the reservation", w.Note)
				}
				h.settle()
				if gateIndex(h.getPod("late4")) < 0 {
					t.Error("4-GPU pod ungated onto a strictly reserved leaf")
				}
				return
			}
			h.waitUngated("late4")
			if n := allocatedNode(h.getClaim("late4")); n != "b" {
				t.Errorf("4-GPU pod on %s, want b: it fits nowhere else, and the reservation is soft", n)
			}
		})
	}
}

// TestReservationNotNamedForNodesThePodCannotUse: with leaf l1 (a, b)
// reserved for a starved gang, a 4-GPU pod whose node selector names only
// c (2 GPUs free) waits, and its waiting message gives the selector as the
// reason for a and b, not the reservation: the node filter asks about the
// reservation last, so a node counts as held off by it only when the pod
// could otherwise run there (and only then is the pod decided again past
// a soft reservation).
func TestReservationNotNamedForNodesThePodCannotUse(t *testing.T) {
	h, _ := startSoftReservation(t, time.Hour, otherNode{"c", "l2"})

	h.claim("pinned", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pinned", Namespace: ns},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "x"}},
			NodeSelector:    map[string]string{corev1.LabelHostname: "c"},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "pinned", ResourceClaimName: ptr.To("pinned")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := h.waitEventWith(ns+"/pinned", report.ReasonWaiting, "selector")
	if contains(w.Note, "reserved") {
		t.Errorf("waiting event %q names the reservation for nodes the pod's selector rules out", w.Note)
	}
	h.settle()
	if gateIndex(h.getPod("pinned")) < 0 {
		t.Error("pinned pod ungated: c has 2 GPUs free, it asks for 4")
	}
}

// TestGangSoftReservationKeepsLinkClass: leaf l1 (a, b) is reserved for a
// starved gang of 2 pods × 4 GPUs, and leaves l2 (c) and l3 (d) have 2
// GPUs free each. A gang of 2 pods × 2 GPUs fits outside l1 only across
// two leaves (c and d), but on one node (b) inside it: while the
// reservation is soft it is placed on b; once strict, on c and d.
func TestGangSoftReservationKeepsLinkClass(t *testing.T) {
	for _, tc := range []struct {
		name   string
		waited time.Duration
		want   []string
	}{
		{"soft", time.Hour, []string{"b", "b"}},
		{"strict", 3 * time.Hour, []string{"c", "d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := startSoftReservation(t, tc.waited, otherNode{"c", "l2"}, otherNode{"d", "l3"})

			h.gangPod("n0", "narrow", 2, 2, nil)
			h.gangPod("n1", "narrow", 2, 2, nil)
			h.waitUngated("n0")
			h.waitUngated("n1")
			got := []string{allocatedNode(h.getClaim("n0")), allocatedNode(h.getClaim("n1"))}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("gang narrow on %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGangTriedPastReservationOnlyWhenHeldOff: with leaf l1 (a, b)
// reserved softly for a starved gang, a gang that fails elsewhere is
// placed a second time past the reservation only when the node filter
// turned a reserved node down for the reservation alone: a gang whose
// pods' selector names only c is decided once per decision (the second
// pass could only find what the first did), while a gang of 3 pods × 4
// GPUs, which b could take one pod of, is tried past it (and still waits:
// a and c have 2 GPUs free each).
func TestGangTriedPastReservationOnlyWhenHeldOff(t *testing.T) {
	h, _ := startSoftReservation(t, time.Hour, otherNode{"c", "l2"})
	h.ctrl.gangRuns.counting.Store(true)
	for i := range 2 {
		p := h.newGangPod(fmt.Sprintf("pinned%d", i), "pinned", 2, 4, nil)
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "c"}
		h.createGangPod(p)
	}
	for i := range 3 {
		h.gangPod(fmt.Sprintf("wide%d", i), "wide", 3, 4, nil)
	}
	h.waitEventWith(ns+"/pinned1", report.ReasonGangWaiting, "gang pinned: 2 pods")
	h.waitEventWith(ns+"/wide2", report.ReasonGangWaiting, "gang wide: 3 pods")
	h.settle()
	runs := &h.ctrl.gangRuns
	pinned, wide := gangKeyOf(t, h, "pinned0"), gangKeyOf(t, h, "wide0")
	if d, p := counted(&runs.decisions, pinned), counted(&runs.placements, pinned); d == 0 || p != d {
		t.Errorf("gang pinned: %d placements in %d decisions, want one each: no reserved node could take its pods", p, d)
	}
	if d, p := counted(&runs.decisions, wide), counted(&runs.placements, wide); d == 0 || p != 2*d {
		t.Errorf("gang wide: %d placements in %d decisions, want two each: reserved node b could take one of its pods", p, d)
	}
	for _, name := range []string{"pinned0", "wide0"} {
		if gateIndex(h.getPod(name)) < 0 {
			t.Errorf("pod %s ungated; its gang fits nowhere", name)
		}
	}
}

// gangKeyOf is the gang key of the named pod, as the controller sees it.
func gangKeyOf(t *testing.T, h *harness, pod string) string {
	t.Helper()
	ref, ok := h.ctrl.gangOf(h.getPod(pod))
	if !ok {
		t.Fatalf("pod %s is in no gang", pod)
	}
	return ref.Key()
}
