package controller

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
)

// TestGangPodsJoinPlacedPodsDomain: pods of a gang Required in one leaf
// that come after some of its pods are placed go to the leaf those pods
// share, not to the tightest fit elsewhere: a replacement for a pod the
// gang lost (fewer than minCount placed, so decided as a gang of the
// missing pods), and a pod beyond minCount (placed on its own), whether
// the placed pods are bound yet or only allocated and handed to
// kube-scheduler. A replacement that does not fit in that leaf waits,
// saying why.
func TestGangPodsJoinPlacedPodsDomain(t *testing.T) {
	req := map[string]string{gangs.LabelLevel: "leaf"}
	for _, tc := range []struct {
		name string
		bind bool
	}{
		{name: "bound", bind: true},
		{name: "allocated, not bound", bind: false},
	} {
		// place places placeLeafGang's gang, binding its pods where
		// their claims are when the case asks.
		place := func(t *testing.T) (*harness, map[string]string) {
			h, placed := placeLeafGang(t, "a", "b", "c")
			if tc.bind {
				h.bind("r0", placed["r0"])
				h.bind("r1", placed["r1"])
			}
			return h, placed
		}
		t.Run(tc.name+"/replacement", func(t *testing.T) {
			h, placed := place(t)
			// r1 is lost (its node failed, say) and replaced; its claim
			// keeps its node's GPUs until released.
			h.deletePod("r1")
			h.gangPod("r2", "run", 2, 4, req)
			h.waitUngated("r2")
			got := allocatedNode(h.getClaim("r2"))
			if got == "d" || got == placed["r0"] || got == placed["r1"] {
				t.Errorf("replacement on %s, want the free node of leaf l1 (r0 on %s, r1 was on %s)", got, placed["r0"], placed["r1"])
			}
			e := h.waitEvent(ns+"/r2", report.ReasonGangPlaced)
			if !contains(e.Note, "within the leaf its 1 pods placed before share") {
				t.Errorf("replacement's event %q, want it to name the placed pods' leaf", e.Note)
			}

			// Another replacement does not fit in l1: it waits, though d
			// has room.
			h.deletePod("r2")
			h.gangPod("r3", "run", 2, 4, req)
			h.waitEventWith(ns+"/r3", report.ReasonGangWaiting, "1 of its pods are placed already, so the other 1 must go to the leaf")
			if n := allocatedNode(h.getClaim("r3")); n != "" {
				t.Errorf("replacement placed on %s outside its gang's leaf", n)
			}
		})
		t.Run(tc.name+"/beyond minCount", func(t *testing.T) {
			h, placed := place(t)
			h.waitControllerSeesPlaced("r0", "r1")
			h.gangPod("r2", "run", 2, 4, req)
			h.waitUngated("r2")
			if got := allocatedNode(h.getClaim("r2")); got == "d" || got == placed["r0"] || got == placed["r1"] {
				t.Errorf("further pod on %s, want the free node of leaf l1 (gang on %v)", got, placed)
			}
		})
	}
}

// deletePod deletes a pod and waits until the controller's cache has
// forgotten it.
func (h *harness) deletePod(name string) {
	h.t.Helper()
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.eventually("the controller sees "+name+" gone", func() bool {
		_, err := h.ctrl.pods.Pods(ns).Get(name)
		return err != nil
	})
}
