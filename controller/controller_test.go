package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

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
	"github.com/gpulink/gpulink/driver/topology"
)

func objs(groups ...[]runtime.Object) []runtime.Object {
	var out []runtime.Object
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

func TestAllocatesNVLinkQuadOnV100(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("quad", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 4)},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
	})
	pod := h.pod("trainer", true, "quad")
	c := h.waitAllocated("quad")
	h.waitUngated("trainer")

	a := c.Status.Allocation
	if a.AllocationTimestamp == nil {
		t.Error("allocationTimestamp not set")
	}
	if got := allocatedNode(c); got != "v100" {
		t.Errorf("node selector names %q, want v100", got)
	}
	// kube-scheduler reserves the claim when it binds the pod, against
	// the claim's resourceVersion (writeDecision says why).
	if len(c.Status.ReservedFor) != 0 {
		t.Errorf("reservedFor = %+v, want it left to kube-scheduler for unbound pod %s", c.Status.ReservedFor, pod.Name)
	}
	if !slices.Contains(c.Finalizers, driver.ClaimFinalizer) {
		t.Errorf("finalizers = %v, want %s", c.Finalizers, driver.ClaimFinalizer)
	}
	if len(a.Devices.Results) != 4 {
		t.Fatalf("got %d results, want 4", len(a.Devices.Results))
	}
	topo := fixtureTopology(t, "v100-sxm2-8-aliyun-sccgn6.txt")
	idx := indices(t, devicesOf(c))
	for i := range idx {
		for j := i + 1; j < len(idx); j++ {
			pi, _ := topo.Position(idx[i])
			pj, _ := topo.Position(idx[j])
			if l := topo.Link(pi, pj); !l.IsNVLink() {
				t.Errorf("GPU%d-GPU%d is %s, want NVLink", idx[i], idx[j], l)
			}
		}
	}
	for _, r := range a.Devices.Results {
		if r.Request != "gpus" || r.Driver != driver.Name || r.Pool != "v100" || r.ShareID != nil || r.ConsumedCapacity != nil {
			t.Errorf("result %+v: want request gpus, driver %s, pool v100, dedicated", r, driver.Name)
		}
	}
	if len(a.Devices.Config) != 1 || a.Devices.Config[0].Source != resourceapi.AllocationConfigSourceClaim {
		t.Errorf("config = %+v, want the claim's opaque config", a.Devices.Config)
	}
	e := h.waitEvent(ns+"/trainer", report.ReasonAllocated)
	if !contains(e.Note, "on v100") || !contains(e.Note, "NV") {
		t.Errorf("event note %q does not explain the allocation", e.Note)
	}
}

func TestShareCapacityRoundedAndConfigCopied(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("small", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1500000", "30")}})
	h.claim("dflt", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "", "")}})
	h.pod("a", true, "small")
	h.pod("b", true, "dflt")
	small := h.waitAllocated("small")
	dflt := h.waitAllocated("dflt")

	r := small.Status.Allocation.Devices.Results[0]
	if r.ShareID == nil {
		t.Fatal("share result has no shareID")
	}
	if got := r.ConsumedCapacity[driver.CapacityMemory]; got.Cmp(resource.MustParse("2Mi")) != 0 {
		t.Errorf("consumed memory %s, want 1500000 bytes rounded up to the plugin's 1Mi step: 2Mi", got.String())
	}
	if got := r.ConsumedCapacity[driver.CapacityCores]; got.Value() != 30 {
		t.Errorf("consumed cores %s, want 30", got.String())
	}
	d := dflt.Status.Allocation.Devices.Results[0]
	if got := d.ConsumedCapacity[driver.CapacityMemory]; got.Cmp(resource.MustParse("4Gi")) != 0 {
		t.Errorf("default share memory %s, want the requestPolicy default 4Gi", got.String())
	}
	if got := d.ConsumedCapacity[driver.CapacityCores]; got.Value() != 25 {
		t.Errorf("default share cores %s, want 25", got.String())
	}
	// Binpack: the second share lands on the GPU the first one opened.
	if r.Device != d.Device {
		t.Errorf("shares on %s and %s, want the same GPU (binpack)", r.Device, d.Device)
	}
	cfg := small.Status.Allocation.Devices.Config
	if len(cfg) != 1 || cfg[0].Source != resourceapi.AllocationConfigSourceClass || !slices.Equal(cfg[0].Requests, []string{"s"}) {
		t.Errorf("config = %+v, want the share class's config for request s", cfg)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

func TestFirstAvailableFallsBack(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "p40", "p40-pcie-7.txt"))...).start()
	h.claim("fa", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpus",
		FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "eight", DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8},
			{Name: "two", DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
		},
	}}})
	h.pod("p", true, "fa")
	c := h.waitAllocated("fa")
	res := c.Status.Allocation.Devices.Results
	if len(res) != 2 || res[0].Request != "gpus/two" {
		t.Fatalf("results %+v, want 2 devices for gpus/two", res)
	}
	// The pair should be the best-connected pair of the P40 box (PIX).
	topo := fixtureTopology(t, "p40-pcie-7.txt")
	idx := indices(t, devicesOf(c))
	pa, _ := topo.Position(idx[0])
	pb, _ := topo.Position(idx[1])
	if l := topo.Link(pa, pb); l != topology.LinkPIX {
		t.Errorf("pair GPU%d-GPU%d is %s, want PIX", idx[0], idx[1], l)
	}
}

func TestSelectorsAndMatchAttribute(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	sel := resourceapi.DeviceRequest{Name: "hi", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.gpulink.dev"].index >= 6`}}},
	}}
	h.claim("sel", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{sel}})
	// Two requests of 2 GPUs that must share the aligned quad (group4):
	// together they form one of the node's NVLink quads.
	group := resourceapi.FullyQualifiedName(driver.Name + "/" + driver.GroupAttr(4))
	h.claim("match", resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{controllertest.WholeRequest("a", 2), controllertest.WholeRequest("b", 2)},
		Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: &group}},
	})
	h.pod("p1", true, "sel")
	h.pod("p2", true, "match")
	s := h.waitAllocated("sel")
	if got := indices(t, devicesOf(s)); !slices.Equal(got, []int{6, 7}) {
		t.Errorf("selector claim got GPUs %v, want [6 7]", got)
	}
	m := h.waitAllocated("match")
	got := indices(t, devicesOf(m))
	topo := fixtureTopology(t, "v100-sxm2-8-aliyun-sccgn6.txt")
	groups := map[int]bool{}
	for _, idx := range got {
		p, _ := topo.Position(idx)
		id, ok := topo.GroupOf(4, p)
		if !ok {
			t.Fatalf("GPU%d is in no aligned quad", idx)
		}
		groups[id] = true
	}
	if len(got) != 4 || len(groups) != 1 {
		t.Errorf("matchAttribute claim got GPUs %v in %d quads, want 4 GPUs of one aligned quad", got, len(groups))
	}
}

func TestAllocationModeAll(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "p40", "p40-pcie-7.txt"))...).start()
	h.claim("all", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeAll}}}})
	h.pod("p", true, "all")
	c := h.waitAllocated("all")
	if n := len(c.Status.Allocation.Devices.Results); n != 7 {
		t.Errorf("allocationMode All got %d devices, want all 7", n)
	}
}

func TestUninterpretableClaimsWarnAndStayGated(t *testing.T) {
	other := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}}
	h := newHarness(t, objs(classes(), []runtime.Object{other}, gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	attr := resourceapi.FullyQualifiedName("gpu.gpulink.dev/nvlinkIsland")
	admin := controllertest.WholeRequest("g", 1)
	admin.Exactly.AdminAccess = ptr.To(true)
	cases := map[string]struct {
		spec resourceapi.DeviceClaim
		want string
	}{
		"admin": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{admin}}, "adminAccess"},
		"distinct": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)},
			Constraints: []resourceapi.DeviceConstraint{{DistinctAttribute: &attr}}}, "distinctAttribute"},
		"mixed": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1),
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com", AllocationMode: resourceapi.DeviceAllocationModeAll}}}}, `requests[1].exactly.allocationMode: Unsupported value: "All"`},
		"badconfig": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)},
			Config: []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","topology":{"policy":"Sometimes"}}`)}}, "topology.policy"},
		"capacity": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: driver.DeviceClassShare, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"bandwidth": resource.MustParse("1")}}}}}}, "bandwidth"},
		"shareall": {resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "g", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: driver.DeviceClassShare, AllocationMode: resourceapi.DeviceAllocationModeAll}}}}, "allocationMode All"},
	}
	for name, tc := range cases {
		h.claim(name, tc.spec)
		h.pod("pod-"+name, true, name)
	}
	for name, tc := range cases {
		e := h.waitEvent(ns+"/pod-"+name, report.ReasonUninterpretable)
		if e.Type != corev1.EventTypeWarning || !contains(e.Note, tc.want) {
			t.Errorf("%s: event %+v, want a warning mentioning %q", name, e, tc.want)
		}
		if h.getClaim(name).Status.Allocation != nil {
			t.Errorf("%s: claim was allocated", name)
		}
		if gateIndex(h.getPod("pod-"+name)) < 0 {
			t.Errorf("%s: gate removed from a pod whose claim cannot be allocated", name)
		}
	}
}

func TestForeignClaimsAreUngatedNotTouched(t *testing.T) {
	other := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "nic.example.com"`}}}}}
	h := newHarness(t, objs(classes(), []runtime.Object{other}, gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("nic", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "n", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "nic.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}})
	h.pod("p", true, "nic")
	h.waitUngated("p")
	got := h.getClaim("nic")
	if got.Status.Allocation != nil || len(got.Finalizers) > 0 {
		t.Errorf("claim nic was touched: %+v", got.Status)
	}
}

// TestToleratingRequestsAllocatedByController: a request that tolerates
// the managed taint is allocated by the controller like any other, so
// that one allocator sees every gpulink decision, and it is held to the
// same rules (here: a claim may not pick strategy None, which would give a
// share without limits).
func TestToleratingRequestsAllocatedByController(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	tolerate := func(r resourceapi.DeviceRequest) resourceapi.DeviceRequest {
		r.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists}}
		return r
	}
	h.claim("tol", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{tolerate(controllertest.WholeRequest("g", 3))}})
	h.claim("plain", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.claim("none", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{tolerate(controllertest.ShareRequest("s", "1Gi", "10"))},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"None"}}`)},
	})
	// A pod not held behind the gate is already kube-scheduler's: its
	// tolerating claim is left to kube-scheduler's allocator.
	h.claim("sched", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{tolerate(controllertest.WholeRequest("g", 1))}})
	h.pod("u", false, "sched")
	h.pod("p", true, "tol")
	h.pod("q", true, "plain")
	h.pod("r", true, "none")
	tol, plain := h.waitAllocated("tol"), h.waitAllocated("plain")
	if !hasFinalizer(tol) || tol.Status.Allocation == nil {
		t.Errorf("tolerating claim not allocated by the controller: finalizers %v, reservedFor %v", tol.Finalizers, tol.Status.ReservedFor)
	}
	if got := devicesOf(tol); len(got) != 3 {
		t.Errorf("tolerating claim got %v, want 3 GPUs", got)
	}
	for _, d := range devicesOf(plain) {
		if slices.Contains(devicesOf(tol), d) {
			t.Errorf("%s given to both claims", d)
		}
	}
	h.waitUngated("p")
	e := h.waitEvent(ns+"/r", report.ReasonUninterpretable)
	if !contains(e.Note, "sharing.strategy") || !contains(e.Note, "None") {
		t.Errorf("event %+v, want the strategy None refusal", e)
	}
	if got := h.getClaim("sched"); got.Status.Allocation != nil || len(got.Finalizers) > 0 {
		t.Errorf("tolerating claim of an ungated pod was touched: %+v", got.Status)
	}
	if h.getClaim("none").Status.Allocation != nil || gateIndex(h.getPod("r")) < 0 {
		t.Error("a share under strategy None was allocated or handed to kube-scheduler")
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

func TestJointAllocationOnOneNode(t *testing.T) {
	// Node a (P40) has 7 PCIe GPUs, node b (V100) 8 NVLink GPUs. A pod
	// with two claims of 4 GPUs must land both on b.
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "p40-pcie-7.txt"), gpuNode(t, "b", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("c1", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.claim("c2", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("p", true, "c1", "c2")
	c1, c2 := h.waitAllocated("c1"), h.waitAllocated("c2")
	if allocatedNode(c1) != "b" || allocatedNode(c2) != "b" {
		t.Fatalf("claims on %s and %s, want both on b", allocatedNode(c1), allocatedNode(c2))
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
	h.waitUngated("p")
}

func TestWaitingExplainsAndRetriesWhenFreed(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("big", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 6)}})
	h.pod("first", true, "big")
	h.waitAllocated("big")
	h.claim("quad", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
	})
	h.pod("second", true, "quad")
	e := h.waitEvent(ns+"/second", report.ReasonWaiting)
	if !contains(e.Note, "4 free GPUs with every pair NVLink (policy Required)") {
		t.Errorf("waiting event %q does not say what is missing", e.Note)
	}
	if gateIndex(h.getPod("second")) < 0 {
		t.Error("waiting pod lost its gate")
	}
	// The first pod goes away: GC releases its claim, the second fits.
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("big released", func() bool {
		c := h.getClaim("big")
		return c.Status.Allocation == nil && len(c.Finalizers) == 0
	})
	h.waitAllocated("quad")
	h.waitUngated("second")
}

func TestInventoryRebuiltFromExistingAllocations(t *testing.T) {
	// A previous controller run allocated gpu-0..gpu-3 whole and a share
	// on gpu-4, then stopped. The new run must count them.
	slice, err := controllertest.Slice("v100", fixtureTopology(t, "v100-sxm2-8-aliyun-sccgn6.txt"), controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: ns, UID: uuid.NewUUID()}, Spec: corev1.PodSpec{NodeName: "v100"}}
	prev := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "prev", Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{NodeSelector: planner.NodeSelectorFor("v100"), AllocationTimestamp: ptr.To(metav1.Now())},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "old", UID: old.UID}},
		},
	}
	for i := range 4 {
		prev.Status.Allocation.Devices.Results = append(prev.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "g", Driver: driver.Name, Pool: "v100", Device: driver.DeviceName(i)})
	}
	sid := uuid.NewUUID()
	prev.Status.Allocation.Devices.Results = append(prev.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
		Request: "g", Driver: driver.Name, Pool: "v100", Device: "gpu-4", ShareID: &sid,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi"), "cores": resource.MustParse("10")}})
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.Node("v100"), slice, old, prev})...).start()
	h.claim("next", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 3)}})
	h.pod("new", true, "next")
	c := h.waitAllocated("next")
	got := indices(t, devicesOf(c))
	if !slices.Equal(got, []int{5, 6, 7}) {
		t.Errorf("new claim got GPUs %v, want [5 6 7]: 0-3 are whole and 4 holds a share", got)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

func TestConcurrentPodsNeverShareADevice(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 8}, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"), gpuNode(t, "p40", "p40-pcie-7.txt"))...).start()
	const pods = 24
	for i := range pods {
		name := fmt.Sprintf("c%d", i)
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
		h.pod(fmt.Sprintf("p%d", i), true, name)
	}
	// 15 GPUs: 15 claims get one, 9 wait.
	h.eventually("15 claims allocated", func() bool {
		n := 0
		for _, c := range h.allClaims() {
			if c.Status.Allocation != nil {
				n++
			}
		}
		return n == 15
	})
	time.Sleep(200 * time.Millisecond)
	n := 0
	for _, c := range h.allClaims() {
		if c.Status.Allocation != nil {
			n++
		}
	}
	if n != 15 {
		t.Errorf("%d claims allocated, want 15 (one per GPU)", n)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

func TestGatedPodWithAllocatedClaimIsUngated(t *testing.T) {
	// The controller stopped between the allocation write and the gate removal.
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...)
	h.claim("c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	pod := h.pod("p", true, "c")
	c := h.getClaim("c")
	c.Finalizers = []string{driver.ClaimFinalizer}
	c, err := h.client.ResourceV1().ResourceClaims(ns).Update(h.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: planner.NodeSelectorFor("v100"), AllocationTimestamp: ptr.To(metav1.Now()),
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "g", Driver: driver.Name, Pool: "v100", Device: "gpu-2"}}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.waitUngated("p")
	if got := devicesOf(h.getClaim("c")); !slices.Equal(got, []string{"gpu-2"}) {
		t.Errorf("allocation changed to %v", got)
	}
}

func TestOrphanedClaimReleased(t *testing.T) {
	gone := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{NodeSelector: planner.NodeSelectorFor("v100"), AllocationTimestamp: ptr.To(metav1.Now()),
				Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "g", Driver: driver.Name, Pool: "v100", Device: "gpu-0"}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vanished", UID: uuid.NewUUID()}},
		},
	}
	// A claim that is being created right now (finalizer, no allocation
	// yet, but pod alive) must not be touched by GC beyond the finalizer
	// once nothing uses it; a claim held by a live pod must stay.
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "alive", Namespace: ns, UID: uuid.NewUUID()}, Spec: corev1.PodSpec{NodeName: "v100"}}
	held := gone.DeepCopy()
	held.Name, held.UID = "held", uuid.NewUUID()
	held.Status.Allocation.Devices.Results[0].Device = "gpu-1"
	held.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "alive", UID: live.UID}}
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"), []runtime.Object{gone, held, live})...).start()
	h.eventually("orphan released", func() bool {
		c := h.getClaim("orphan")
		return c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0 && len(c.Finalizers) == 0
	})
	time.Sleep(100 * time.Millisecond)
	if c := h.getClaim("held"); c.Status.Allocation == nil || len(c.Finalizers) == 0 {
		t.Errorf("claim of a live pod was released: %+v", c.Status)
	}
}

// unschedulableOnFirstNode creates claim (2 whole GPUs) and pod, waits
// for the allocation and the gate's removal, and reports the pod
// unschedulable there as kube-scheduler would; it returns the node.
func (h *harness) unschedulableOnFirstNode(claim, pod string) string {
	h.t.Helper()
	h.claim(claim, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod(pod, true, claim)
	first := allocatedNode(h.waitAllocated(claim))
	h.waitUngated(pod)
	p := h.getPod(pod)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/2 nodes are available: 1 Insufficient cpu."}}
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return first
}

func TestUnschedulablePodIsMovedToAnotherNode(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, UnschedulableGrace: 50 * time.Millisecond},
		objs(classes(), gpuNode(t, "a", "v100-sxm2-8-aliyun-sccgn6.txt"), gpuNode(t, "b", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	first := h.unschedulableOnFirstNode("c", "p")
	e := h.waitEvent(ns+"/p", report.ReasonReleased)
	if !contains(e.Note, first) || !contains(e.Note, "Insufficient cpu") {
		t.Errorf("release event %q does not name the node and the scheduler's reason", e.Note)
	}
	h.eventually("claim reallocated on the other node", func() bool {
		c := h.getClaim("c")
		return c.Status.Allocation != nil && allocatedNode(c) != first
	})
}

func TestSchedulerDeallocationExcludesNode(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "v100-sxm2-8-aliyun-sccgn6.txt"), gpuNode(t, "b", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("p", true, "c")
	first := allocatedNode(h.waitAllocated("c"))
	h.waitUngated("p")
	// kube-scheduler's DRA PostFilter deallocates a claim reserved only for
	// a pod that does not fit the claim's node.
	c := h.getClaim("c")
	c.Status.ReservedFor = nil
	c.Status.Allocation = nil
	if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("claim reallocated on the other node", func() bool {
		c := h.getClaim("c")
		return c.Status.Allocation != nil && allocatedNode(c) != first
	})
	if e := h.waitEvent(ns+"/p", report.ReasonReleased); !contains(e.Note, first) {
		t.Errorf("release event %q does not name node %s", e.Note, first)
	}
}

func TestDeviceTaintRuleIsHonoured(t *testing.T) {
	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: "maintenance"},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(driver.Name), Pool: ptr.To("v100"), Device: ptr.To("gpu-0")},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoExecute},
		},
	}
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"), []runtime.Object{rule})...).start()
	h.claim("eight", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}})
	h.pod("big", true, "eight")
	e := h.waitEvent(ns+"/big", report.ReasonWaiting)
	if !contains(e.Note, "example.com/maintenance") {
		t.Errorf("waiting event %q does not name the taint", e.Note)
	}
	tol := controllertest.WholeRequest("g", 8)
	tol.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: "example.com/maintenance", Operator: resourceapi.DeviceTolerationOpExists}}
	h.claim("tolerant", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{tol}})
	h.pod("ok", true, "tolerant")
	c := h.waitAllocated("tolerant")
	if n := len(c.Status.Allocation.Devices.Results); n != 8 {
		t.Errorf("tolerating claim got %d devices, want 8", n)
	}
	if len(c.Status.Allocation.Devices.Results[0].Tolerations) != 1 {
		t.Error("request tolerations not copied into the results")
	}
}

// A node whose taints change without changing in number (one taint swapped
// for another) may now fit waiting pods: they are retried at once, not
// only after WaitingRetry. Heartbeats (status-only updates) retry nothing.
func TestNodeTaintChangeRetriesWaitingPods(t *testing.T) {
	h := newHarness(t)
	close(h.done) // never started: the handler is called directly
	h.ctrl.setWaiting(ns+"/p", true)
	old := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "1"},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "maintenance", Effect: corev1.TaintEffectNoSchedule}}}}
	heartbeat := old.DeepCopy()
	heartbeat.ResourceVersion = "2"
	heartbeat.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	h.ctrl.onNodeUpdate(old, heartbeat)
	if n := h.ctrl.podQueue.Len(); n != 0 {
		t.Fatalf("heartbeat enqueued %d pods, want 0", n)
	}
	swapped := heartbeat.DeepCopy()
	swapped.ResourceVersion = "3"
	swapped.Spec.Taints[0].Effect = corev1.TaintEffectPreferNoSchedule
	h.ctrl.onNodeUpdate(heartbeat, swapped)
	if n := h.ctrl.podQueue.Len(); n != 1 {
		t.Errorf("taint change enqueued %d pods, want the 1 waiting pod", n)
	}
}

// A pod that finishes gives its GPUs back without being deleted: its
// reservation is dropped and the claim, which no live pod wants, released.
func TestFinishedPodReleasesClaim(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("p", true, "c")
	h.waitAllocated("c")
	h.waitUngated("p")
	p := h.getPod("p")
	p.Status.Phase = corev1.PodSucceeded
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("claim of the finished pod released", func() bool {
		c := h.getClaim("c")
		return c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0 && len(c.Finalizers) == 0
	})
}

// A GPU that becomes unhealthy while a pod holds it (the kubelet plugin
// taints it NoSchedule in the slice): the running allocation is left alone,
// new claims avoid the tainted GPUs, held or free.
func TestHealthTaintWhileHeld(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("first", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("p1", true, "first")
	held := devicesOf(h.waitAllocated("first"))
	h.waitUngated("p1")
	h.bindRunning("p1", "v100")

	// The plugin taints one held GPU and one free one.
	var free string
	for i := range 8 {
		if d := driver.DeviceName(i); !slices.Contains(held, d) {
			free = d
			break
		}
	}
	tainted := []string{held[0], free}
	slice := h.allSlices()[0]
	for i, d := range slice.Spec.Devices {
		if slices.Contains(tainted, d.Name) {
			slice.Spec.Devices[i].Taints = append(slice.Spec.Devices[i].Taints, resourceapi.DeviceTaint{
				Key: driver.UnhealthyTaintKey, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule,
			})
		}
	}
	if _, err := h.client.ResourceV1().ResourceSlices().Update(h.ctx, &slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod created before the controller sees the taints would get the
	// tainted free GPU, as it would on a cluster. Every device carries the
	// managed taint too, so the unhealthy one is looked for by its key.
	h.eventually("the controller sees the taints", func() bool {
		n := h.ctrl.inv.Node("v100")
		if n == nil {
			return false
		}
		seen := 0
		for _, d := range n.Devices {
			if slices.Contains(tainted, d.Name) && slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == driver.UnhealthyTaintKey }) {
				seen++
			}
		}
		return seen == len(tainted)
	})

	// Six GPUs are free but only five are healthy: six waits, naming the taint.
	h.claim("six", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 6)}})
	h.pod("p6", true, "six")
	if e := h.waitEvent(ns+"/p6", report.ReasonWaiting); !contains(e.Note, driver.UnhealthyTaintKey) {
		t.Errorf("waiting event %q does not name the unhealthy taint", e.Note)
	}
	// Five get exactly the healthy free GPUs.
	h.claim("five", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 5)}})
	h.pod("p5", true, "five")
	got := devicesOf(h.waitAllocated("five"))
	for _, d := range got {
		if slices.Contains(tainted, d) || slices.Contains(held, d) {
			t.Errorf("claim five got %v, which includes a tainted or held GPU (tainted %v, held %v)", got, tainted, held)
		}
	}
	// The pod on the tainted GPU is not disturbed: same allocation, reserved, ungated.
	c := h.getClaim("first")
	if c.Status.Allocation == nil || !slices.Equal(devicesOf(c), held) || len(c.Status.ReservedFor) != 1 {
		t.Errorf("claim first after the taint: allocation %v, reservedFor %v; want %v kept for p1", c.Status.Allocation, c.Status.ReservedFor, held)
	}
	if p := h.getPod("p1"); p.DeletionTimestamp != nil || gateIndex(p) >= 0 {
		t.Errorf("pod p1 disturbed by a NoSchedule taint: deleting %v, gated %v", p.DeletionTimestamp != nil, gateIndex(p) >= 0)
	}
}
