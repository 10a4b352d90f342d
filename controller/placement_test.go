package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

func spreadConfig(field string) []resourceapi.DeviceClaimConfiguration {
	return []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","placement":{"` + field + `":"Spread"}}`)}
}

// TestPodPlacementPolicy: HAMi's per-pod hami.io/node-scheduler-policy
// (and GpuConfig.placement in a claim) overrides the controller's
// cluster-wide binpack for that pod alone, decided by the same allocator
// and said in the allocation event; claims of one pod that disagree are
// refused by name (issue 18, defect 4: specify_scheduling_policy.yaml was
// refused at admission).
func TestPodPlacementPolicy(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"), gpuNode(t, "b", "pcie-4.txt"))...).start()
	whole := func(name string, config []resourceapi.DeviceClaimConfiguration) {
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}, Config: config})
	}
	nodeOf := func(claim string) string {
		c := h.waitAllocated(claim)
		return c.Status.Allocation.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0]
	}
	// Binpack (the flags): the second pod joins the first one's node.
	whole("first", nil)
	h.pod("first", true, "first")
	busy := nodeOf("first")
	whole("packed", nil)
	h.pod("packed", true, "packed")
	if got := nodeOf("packed"); got != busy {
		t.Fatalf("binpack put the second pod on %s, want %s", got, busy)
	}

	// The pod's annotation spreads it to the idle node.
	whole("spread", nil)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "spread", Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
			Annotations: map[string]string{compat.AnnotationNodePolicy: "Spread"}},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "spread", ResourceClaimName: ptr.To("spread")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := nodeOf("spread"); got == busy {
		t.Errorf("annotation %s=spread: placed on the busy node %s", compat.AnnotationNodePolicy, got)
	}
	if e := h.waitEvent(ns+"/spread", report.ReasonAllocated); !strings.Contains(e.Note, "nodes spread (annotation hami.io/node-scheduler-policy)") {
		t.Errorf("allocation event %q does not say the pod's own policy placed it", e.Note)
	}

	// The same from the claim's configuration.
	whole("by-config", spreadConfig("node"))
	h.pod("by-config", true, "by-config")
	nodes := map[string]int{}
	for _, c := range []string{"first", "packed", "spread"} {
		nodes[nodeOf(c)]++
	}
	least := "a"
	if nodes["b"] < nodes["a"] {
		least = "b"
	}
	if got := nodeOf("by-config"); got != least {
		t.Errorf("placement.node Spread in the claim: placed on %s, want the least used node %s (usage %v)", got, least, nodes)
	}

	// Two claims of one pod that disagree wait, named.
	whole("x", spreadConfig("node"))
	h.claim("y", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)},
		Config: []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","placement":{"node":"Binpack"}}`)}})
	h.pod("both", true, "x", "y")
	e := h.waitEvent(ns+"/both", report.ReasonUninterpretable)
	for _, want := range []string{"placement.node", "Spread (claim x)", "Binpack (claim y)", compat.AnnotationNodePolicy} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
	if c := h.getClaim("x"); c.Status.Allocation != nil {
		t.Error("claim x of a pod with conflicting placements was allocated")
	}
}
