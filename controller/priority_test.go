package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
)

// prioritizedShare is a claim spec of one MPS share with a task priority.
func prioritizedShare(priority string) resourceapi.DeviceClaim {
	return resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")},
		Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver:     driver.Name,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":` + priority + `}}`)},
		}}}},
	}
}

// A pod whose MPS share has a priority is told what it orders: its own
// processes only (Normal, alone on its GPU), and nothing against the
// shares of other claims on its GPU (Warning, naming the GPU), since each
// MPS claim has a server of its own.
func TestPriorityScopeEvents(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	h.claim("low", prioritizedShare("1"))
	h.mpsPod("a", "low", nil, nil)
	h.waitAllocated("low")
	e := h.waitEvent(ns+"/a", report.ReasonPriorityScope)
	if e.Type != corev1.EventTypeNormal {
		t.Errorf("alone on its GPU: event type %s, want Normal: %s", e.Type, e.Note)
	}
	for _, want := range []string{"claim low", "sharing.priority 1", "CUDA_MPS_CLIENT_PRIORITY=1", "own MPS server", "What MPS guarantees"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
	// Bin-packing puts the next share on the same GPU: two servers.
	h.claim("high", prioritizedShare("0"))
	h.mpsPod("b", "high", nil, nil)
	h.waitAllocated("high")
	e = h.waitEvent(ns+"/b", report.ReasonPriorityScope)
	t.Logf("%s %s: %s", e.Type, e.Reason, e.Note)
	if e.Type != corev1.EventTypeWarning {
		t.Errorf("beside another claim's share: event type %s, want Warning: %s", e.Type, e.Note)
	}
	for _, want := range []string{"claim high", "sharing.priority 0", "cannot be ordered against", "gpu-", "(1 share)"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
	// A share without a priority gets no such event.
	h.claim("plain", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}})
	h.mpsPod("c", "plain", nil, nil)
	h.waitAllocated("plain")
	h.waitEvent(ns+"/c", report.ReasonAllocated)
	if e, ok := h.rec.find(ns+"/c", report.ReasonPriorityScope); ok {
		t.Errorf("share without a priority got %s: %s", report.ReasonPriorityScope, e.Note)
	}
}

// priorityScope counts the shares of the pod's other claims planned onto
// the same GPU, and says nothing for whole GPUs or HAMi-core shares.
func TestPriorityScopeNote(t *testing.T) {
	prio := 1
	mps := &planner.Alternative{ResultName: "s", Share: true, Config: configWith("MPS", &prio)}
	hami := &planner.Alternative{ResultName: "s", Share: true, Config: configWith("HAMiCore", &prio)}
	node := &planner.NodeInventory{Node: "n", Devices: []*planner.DeviceInfo{{Name: "gpu-0"}, {Name: "gpu-1"}}}
	share := &allocate.ShareRequest{MemoryBytes: 1 << 30, Cores: 10}
	claims := []*planner.Claim{{Claim: &resourceapi.ResourceClaim{}}, {Claim: &resourceapi.ResourceClaim{}}}
	claims[0].Claim.Name, claims[1].Claim.Name = "first", "second"

	pl := &planner.Plan{Node: node, Base: make([]allocate.GPUUsage, 2), Claims: [][]planner.PlacedResult{
		{{Alt: mps, Positions: []int{1}, Share: share}},
		{{Alt: hami, Positions: []int{1}, Share: share}},
	}}
	note, crowded := priorityScope(pl, claims)
	if !crowded || !strings.Contains(note, "claim first") || !strings.Contains(note, "gpu-1 (1 share)") || strings.Contains(note, "claim second") {
		t.Errorf("crowded %t, note %q: want claim first crowded on gpu-1 by one share, nothing on the HAMi-core claim", crowded, note)
	}
	pl.Claims[0][0].Share = nil // a whole GPU
	if note, _ := priorityScope(pl, claims); note != "" {
		t.Errorf("whole GPU with a priority: note %q, want none", note)
	}
}

func configWith(strategy string, priority *int) *v1alpha1.GpuConfig {
	c := &v1alpha1.GpuConfig{Sharing: &v1alpha1.SharingConfig{Strategy: v1alpha1.SharingStrategy(strategy), Priority: priority}}
	c.Default()
	return c
}
