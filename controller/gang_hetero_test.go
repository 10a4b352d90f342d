package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/controller/report"
)

// TestGangHeterogeneous: a gang whose pods ask for different GPU counts
// (4 and 8 on two 8-GPU nodes) is placed by its largest pod's claims:
// one pod per node, where planning by the first pod (4 GPUs, 2 per node)
// would put both on one node, where the 8-GPU pod does not fit.
func TestGangHeterogeneous(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-switch-8.txt"), gpuNode(t, "b", "pcie-switch-8.txt"))...).start()
	h.gangPod("p0", "mixed", 2, 4, nil)
	h.gangPod("p1", "mixed", 2, 8, nil)
	h.waitUngated("p0")
	h.waitUngated("p1")
	nodes := h.allocatedNodes("p0", "p1")
	if !samePair(nodes["p0"], nodes["p1"], "a", "b") {
		t.Errorf("gang of 4- and 8-GPU pods on %v, want one node each", nodes)
	}
	if e := h.waitEvent(ns+"/p0", report.ReasonGangPlaced); e.Type != corev1.EventTypeNormal {
		t.Errorf("placed event %+v", e)
	}
}
