package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// shareIn creates, in namespace, a claim with one share of class and a
// gated pod of the same name using it as user (nil: unset).
func (h *harness) shareIn(namespace, name, class string, count int64, user *int64) {
	h.t.Helper()
	req := resourceapi.DeviceRequest{Name: "s", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			driver.CapacityMemory: resource.MustParse("2Gi"), driver.CapacityCores: resource.MustParse("30")}}}}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: uuid.NewUUID()},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}}
	if _, err := h.client.ResourceV1().ResourceClaims(namespace).Create(h.ctx, c, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	ctr := corev1.Container{Name: "main", Image: "x", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}
	if user != nil {
		ctr.SecurityContext = &corev1.SecurityContext{RunAsUser: user}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
			Containers:      []corev1.Container{ctr},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if _, err := h.client.CoreV1().Pods(namespace).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// deviceOf waits for the claim's allocation and returns its one device.
func (h *harness) deviceOf(namespace, name string) string {
	h.t.Helper()
	var dev string
	h.eventually("claim "+namespace+"/"+name+" allocated", func() bool {
		c, err := h.client.ResourceV1().ResourceClaims(namespace).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil {
			return false
		}
		dev = c.Status.Allocation.Devices.Results[0].Device
		return true
	})
	return dev
}

// TestConcurrentSharesKeepToTheirNamespace: the concurrent MPS shares of a
// namespace pack onto one GPU (one MPS server), another namespace's go to
// another GPU, and an isolated share never joins a GPU of concurrent
// shares, nor a concurrent share one of isolated shares. Once every GPU is
// taken by other groups, the next share waits and says why.
func TestConcurrentSharesKeepToTheirNamespace(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	h.shareIn("team-a", "a1", driver.DeviceClassShareConcurrent, 1, nil)
	a1 := h.deviceOf("team-a", "a1")
	h.shareIn("team-a", "a2", driver.DeviceClassShareConcurrent, 1, nil)
	if a2 := h.deviceOf("team-a", "a2"); a2 != a1 {
		t.Errorf("second concurrent share of team-a on %s, want %s with the first (one MPS server)", a2, a1)
	}
	h.shareIn("team-b", "b1", driver.DeviceClassShareConcurrent, 1, nil)
	b1 := h.deviceOf("team-b", "b1")
	if b1 == a1 {
		t.Errorf("team-b's concurrent share joined team-a's GPU %s", a1)
	}
	h.shareIn("team-a", "i1", driver.DeviceClassShare, 1, nil)
	i1 := h.deviceOf("team-a", "i1")
	if i1 == a1 || i1 == b1 {
		t.Errorf("isolated share on %s, a GPU of concurrent shares (%s, %s)", i1, a1, b1)
	}
	h.shareIn("team-c", "c1", driver.DeviceClassShareConcurrent, 1, nil)
	c1 := h.deviceOf("team-c", "c1")
	if c1 == a1 || c1 == b1 || c1 == i1 {
		t.Errorf("team-c's concurrent share on %s, which holds other shares (%s, %s, %s)", c1, a1, b1, i1)
	}
	// Every GPU now holds one group: team-d finds none.
	h.shareIn("team-d", "d1", driver.DeviceClassShareConcurrent, 1, nil)
	e := h.waitEvent("team-d/d1", report.ReasonWaiting)
	if !strings.Contains(e.Note, "holding shares of another sharing group") {
		t.Errorf("waiting event %q does not say the GPUs hold other groups' shares", e.Note)
	}
}

// TestConcurrentShareInterpretation: a concurrent class asks one share per
// request, and a claim's MPS shares take one mode; the event names the
// setting.
func TestConcurrentShareInterpretation(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	h.shareIn(ns, "two", driver.DeviceClassShareConcurrent, 2, nil)
	e := h.waitEvent(ns+"/two", report.ReasonUninterpretable)
	for _, want := range []string{"spec.devices.requests[0].exactly.count", "sharing.mpsMode=Concurrent", driver.DeviceClassShareConcurrent} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
	share := func(name, class string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	}
	h.claim("mixed", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{share("iso", driver.DeviceClassShare), share("conc", driver.DeviceClassShareConcurrent)}})
	h.pod("mixed", true, "mixed")
	e = h.waitEvent(ns+"/mixed", report.ReasonUninterpretable)
	for _, want := range []string{"request iso (DeviceClass gpu-share.gpulink.dev)", "request conc (DeviceClass gpu-share-concurrent.gpulink.dev)", "one claim's MPS shares take one mode"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
}

// TestConcurrentSharesOfOtherUsersWait: a pod of another user than the
// live pods already using its namespace's MPS server on the GPU stays
// gated, whether its claim is already allocated there or would be; the
// same user joins.
func TestConcurrentSharesOfOtherUsersWait(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	h.shareIn(ns, "first", driver.DeviceClassShareConcurrent, 1, ptr.To[int64](1000))
	dev := h.deviceOf(ns, "first")
	h.waitUngated("first")
	h.shareIn(ns, "same", driver.DeviceClassShareConcurrent, 1, ptr.To[int64](1000))
	if got := h.deviceOf(ns, "same"); got != dev {
		t.Fatalf("second concurrent share on %s, want %s", got, dev)
	}
	h.waitUngated("same")
	h.shareIn(ns, "other", driver.DeviceClassShareConcurrent, 1, ptr.To[int64](0))
	e := h.waitEvent(ns+"/other", report.ReasonMPSUsersDiffer)
	for _, want := range []string{"user 0 (other/main)", "user 1000 (first/main, same/main)", "a/" + dev, "sharing.mpsMode=Concurrent"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("event %q lacks %q", e.Note, want)
		}
	}
	if gateIndex(h.getPod("other")) < 0 {
		t.Error("pod of user 0 ungated onto the MPS server of user 1000")
	}
	if c := h.getClaim("other"); c.Status.Allocation != nil {
		t.Errorf("claim of the waiting pod allocated: %+v", c.Status.Allocation.Devices.Results)
	}
}

// TestLedgerReadsShareGroupsFromAllocations: a claim allocated before a
// restart (or by kube-scheduler) counts in its sharing group, read from the
// configuration its allocation carries.
func TestLedgerReadsShareGroupsFromAllocations(t *testing.T) {
	var concurrent, isolated *resourceapi.DeviceClass
	for _, c := range planner.DeviceClasses() {
		switch c.Name {
		case driver.DeviceClassShareConcurrent:
			concurrent = c
		case driver.DeviceClassShare:
			isolated = c
		}
	}
	claimOf := func(namespace string, class *resourceapi.DeviceClass, claimCfg string) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: namespace, UID: uuid.NewUUID()}}
		id := uuid.NewUUID()
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "s", Driver: driver.Name, Pool: "a", Device: "gpu-1", ShareID: &id}},
			Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClass, Requests: []string{"s"},
				DeviceConfiguration: *class.Spec.Config[0].DeviceConfiguration.DeepCopy()}},
		}}
		if claimCfg != "" {
			c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
				Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(claimCfg)}}}})
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"concurrent class", claimOf("team-a", concurrent, ""), planner.ConcurrentGroup("team-a")},
		{"isolated class", claimOf("team-a", isolated, ""), ""},
		{"concurrent class, claim sets a priority", claimOf("team-b", concurrent, `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":1}}`), planner.ConcurrentGroup("team-b")},
		{"configuration that does not decode", claimOf("team-a", concurrent, `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","bogus":1}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uses := planner.UsesOf(tc.claim)
			if len(uses) != 1 || uses[0].Group != tc.want {
				t.Fatalf("uses %+v, want one share of group %q", uses, tc.want)
			}
			l := planner.NewLedger()
			l.Observe(tc.claim)
			if got := l.UsageOf(uses[0].Key); got.Group != tc.want || got.Shares != 1 {
				t.Errorf("ledger usage %+v, want one share of group %q", got, tc.want)
			}
		})
	}
	// Shares of two groups on one device show as mixed: no share joins.
	l := planner.NewLedger()
	l.Observe(claimOf("team-a", concurrent, ""))
	l.Observe(claimOf("team-b", concurrent, ""))
	key := planner.DeviceKey{Pool: "a", Device: "gpu-1"}
	if got := l.UsageOf(key); got.Group != allocate.MixedShareGroups {
		t.Errorf("two groups on one device: group %q, want mixed", got.Group)
	}
}

// A claim's concurrent MPS shares reach one MPS server, so they come out on
// one GPU: pinned to two GPUs the claim waits and says why, and left free
// they go to one GPU even with equal cores (which would be fine for
// isolated shares on two GPUs). The priority note says what the priority
// orders under one server.
func TestConcurrentSharesOfAClaimOnOneGPU(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "node", "pcie-4.txt"))...).start()
	concurrent := func(name string) resourceapi.DeviceRequest {
		r := controllertest.ShareRequest(name, "1Gi", "30")
		r.Exactly.DeviceClassName = driver.DeviceClassShareConcurrent
		return r
	}
	h.claim("pinned", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{onDevice(concurrent("a"), 2), onDevice(concurrent("b"), 3)}})
	h.pod("pod-pinned", true, "pinned")
	e := h.waitEvent(ns+"/pod-pinned", report.ReasonWaiting)
	for _, want := range []string{"sharing.mpsMode=Concurrent", "devices gpu-2 and gpu-3", "one MPS server, which serves one GPU"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("waiting event %q lacks %q", e.Note, want)
		}
	}
	h.claim("free", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{concurrent("a"), concurrent("b")},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":0}}`)},
	})
	h.pod("pod-free", true, "free")
	held, ok, err := gpuview.ClaimDevices(h.waitAllocated("free"))
	if err != nil || !ok || len(held.Devices) != 2 || held.Devices[0] != held.Devices[1] {
		t.Fatalf("concurrent shares of one claim on %v (%v, %v), want one GPU", held.Devices, ok, err)
	}
	e = h.waitEvent(ns+"/pod-free", report.ReasonPriorityScope)
	if e.Type != corev1.EventTypeNormal || !strings.Contains(e.Note, "orders the clients of namespace default's MPS server on "+held.Devices[0]) {
		t.Errorf("priority note %s %q, want a Normal note on the namespace's server", e.Type, e.Note)
	}
}
