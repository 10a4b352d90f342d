package controller

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpulink/gpulink/controller/report"
)

// TestBoundElsewhereReported: a pod bound to another node than its
// claim's allocation (the residual of the release settle) gets one
// Warning naming both nodes and what to do, and errors_total counts it
// once however often the pod is synced.
func TestBoundElsewhereReported(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"), gpuNode(t, "b", "pcie-4.txt"))...).start()
	h.oneGPUClaims("c")
	h.pod("p", true, "c")
	allocated := allocatedNode(h.waitAllocated("c"))
	h.waitUngated("p")
	other := map[string]string{"a": "b", "b": "a"}[allocated]
	h.reserve(h.getPod("p"))
	h.bind("p", other)
	e := h.waitEvent(ns+"/p", report.ReasonBoundElsewhere)
	for _, want := range []string{"bound to node " + other, "claim c is allocated on node " + allocated, "delete the pod"} {
		if !contains(e.Note, want) {
			t.Errorf("event %q does not say %q", e.Note, want)
		}
	}
	for range 3 {
		h.ctrl.podQueue.Add(ns + "/p")
	}
	h.settle()
	if n := testutil.ToFloat64(h.ctrl.metrics.Errors.WithLabelValues(errReasonBoundElsewhere)); n != 1 {
		t.Errorf("errors_total{reason=bound_elsewhere} = %v after repeated syncs, want 1", n)
	}
	if c := h.getClaim("c"); allocatedNode(c) != allocated || len(c.Status.ReservedFor) != 1 {
		t.Errorf("claim changed: node %q, reservedFor %v; want it left as it is", allocatedNode(c), c.Status.ReservedFor)
	}
}

// TestBoundOnClaimNodeNotReported: a pod bound where its claim is
// allocated is the normal case: no such event.
func TestBoundOnClaimNodeNotReported(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	h.oneGPUClaims("c")
	h.pod("p", true, "c")
	h.waitAllocated("c")
	h.waitUngated("p")
	h.bindRunning("p", "a")
	h.ctrl.podQueue.Add(ns + "/p")
	h.settle()
	if e, ok := h.rec.find(ns+"/p", report.ReasonBoundElsewhere); ok {
		t.Errorf("pod bound on its claim's node reported: %q", e.Note)
	}
	if n := testutil.ToFloat64(h.ctrl.metrics.Errors.WithLabelValues(errReasonBoundElsewhere)); n != 0 {
		t.Errorf("errors_total{reason=bound_elsewhere} = %v, want 0", n)
	}
}
