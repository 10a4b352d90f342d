package controller

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// runPodIn does what kube-scheduler and the kubelet would to a pod of
// namespace: binds it to node and marks it Running, once it is ungated.
func (h *harness) runPodIn(namespace, name, node string) {
	h.t.Helper()
	pods := h.client.CoreV1().Pods(namespace)
	h.eventually("pod "+namespace+"/"+name+" ungated", func() bool {
		p, err := pods.Get(h.ctx, name, metav1.GetOptions{})
		return err == nil && gateIndex(p) < 0
	})
	p, err := pods.Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	// kube-scheduler's PreBind reserves the pod's claims before it binds
	// it: the controller writes no reservation for an unbound pod.
	claims := h.client.ResourceV1().ResourceClaims(namespace)
	for _, pc := range p.Spec.ResourceClaims {
		if pc.ResourceClaimName == nil {
			continue
		}
		c, err := claims.Get(h.ctx, *pc.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		if slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }) {
			continue
		}
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
		if _, err := claims.UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
			h.t.Fatalf("reserving claim %s for pod %s: %v", c.Name, p.Name, err)
		}
	}
	p.Spec.NodeName = node
	if p, err = pods.Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	if _, err := pods.UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// A deleted claim's Concurrent MPS share, still used by its running pod,
// keeps counting as a share of its namespace's MPS group: in the hold
// record and after a controller restart, an Isolated share (or another
// namespace's) does not join its GPU, whose MPS server still runs (the
// kubelet plugin would refuse that pod at every retry); a Concurrent share
// of the same namespace still does.
func TestHoldRecordKeepsConcurrentShareGroup(t *testing.T) {
	cfg := Config{Workers: 2, DeviceTaintRules: true, HoldNamespace: holdNS}
	h := newHoldHarness(t, cfg, objs(classes(), gpuNode(t, "n4", "pcie-4.txt"))...).start()
	h.shareIn("team-a", "c1", driver.DeviceClassShareConcurrent, 1, nil)
	held := h.deviceOf("team-a", "c1")
	// The three other GPUs are taken whole: the held GPU is the only one
	// with room for a share.
	h.claim("three", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 3)}})
	h.pod("w", true, "three")
	h.waitAllocated("three")
	h.runPodIn("team-a", "c1", "n4")
	if err := h.client.ResourceV1().ResourceClaims("team-a").Delete(h.ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the hold record with its allocation", func() bool {
		r := h.holdRecords()
		return len(r) == 1 && r[0].Status.Allocation != nil
	})

	// before: the pod's Waiting events before the decision waited for.
	notPlacedBeside := func(namespace, name, when string, before int) {
		t.Helper()
		h.eventually(namespace+"/"+name+" decided "+when, func() bool {
			c, err := h.client.ResourceV1().ResourceClaims(namespace).Get(h.ctx, name, metav1.GetOptions{})
			return (err == nil && c.Status.Allocation != nil) || h.countEvents(namespace+"/"+name, report.ReasonWaiting) > before
		})
		c, err := h.client.ResourceV1().ResourceClaims(namespace).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation != nil {
			t.Fatalf("%s: %s/%s placed on %s beside the deleted claim's Concurrent MPS share, whose pod and MPS server still run", when, namespace, name, c.Status.Allocation.Devices.Results[0].Device)
		}
	}
	h.shareIn("team-b", "iso", driver.DeviceClassShare, 1, nil)
	notPlacedBeside("team-b", "iso", "with the hold record", 0)
	h.shareIn("team-c", "conc", driver.DeviceClassShareConcurrent, 1, nil)
	notPlacedBeside("team-c", "conc", "with the hold record", 0)

	// A restarted controller knows only the record.
	iso, conc := h.countEvents("team-b/iso", report.ReasonWaiting), h.countEvents("team-c/conc", report.ReasonWaiting)
	h.restart(cfg)
	notPlacedBeside("team-b", "iso", "after a controller restart", iso)
	notPlacedBeside("team-c", "conc", "after a controller restart", conc)
	// The namespace's own Concurrent shares still join its MPS server.
	h.shareIn("team-a", "c2", driver.DeviceClassShareConcurrent, 1, nil)
	if got := h.deviceOf("team-a", "c2"); got != held {
		t.Errorf("team-a's next Concurrent share on %s, want %s beside its group's held share", got, held)
	}
}

// A record written before records kept each result's request and the
// configuration cannot tell a Concurrent MPS share from another: its
// shares form a group of their own (no share joins their GPU until the
// record goes); a record that keeps them counts each share in its group.
func TestHeldUsesGroups(t *testing.T) {
	share := resourceapi.DeviceRequestAllocationResult{Request: holdRequest, Driver: driver.Name, Pool: "n4", Device: "gpu-0", ShareID: ptr.To(types.UID("s1")),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{driver.CapacityMemory: resource.MustParse("2Gi"), driver.CapacityCores: resource.MustParse("30")}}
	whole := resourceapi.DeviceRequestAllocationResult{Request: holdRequest, Driver: driver.Name, Pool: "n4", Device: "gpu-1"}
	alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{share, whole}}}
	concurrent := resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClass, Requests: []string{"s"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver.Name,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsMode":"Concurrent"}}`)}}}}
	for _, tc := range []struct {
		name   string
		record *holdRecord
		want   string
	}{
		{"legacy record", &holdRecord{Claim: "team-a/c1"}, unknownHeldGroup},
		{"unreadable record", nil, unknownHeldGroup},
		{"record with requests and config", &holdRecord{Claim: "team-a/c1", Requests: []string{"s", "g"}, Config: []resourceapi.DeviceAllocationConfiguration{concurrent}}, planner.ConcurrentGroup("team-a")},
		{"ordinary share", &holdRecord{Claim: "team-a/c1", Requests: []string{"s", "g"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uses := heldUses(alloc, tc.record)
			if len(uses) != 2 || uses[0].Group != tc.want || !uses[1].Exclusive || uses[1].Group != "" {
				t.Errorf("uses %+v, want the share in group %q and the whole GPU exclusive", uses, tc.want)
			}
		})
	}
	if alloc.Devices.Results[0].Request != holdRequest || alloc.Devices.Config != nil {
		t.Errorf("heldUses changed the record's allocation: %+v", alloc.Devices)
	}
}
