package controller

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// MIG on demand: GPUs published as partitions that consume counters of
// their GPU's counter set (driver/mig/ondemand.go); the controller places
// mig.gpulink.dev requests on them with look-ahead (nodeplan_mig.go).

// onDemandNode is a node of a go-nvml mock server whose GPUs onDemand are
// partitioned on demand (no instances), the others whole.
func onDemandNode(t *testing.T, server, node string, onDemand ...int) []runtime.Object {
	t.Helper()
	layout := map[int][]string{}
	for _, i := range onDemand {
		layout[i] = nil
	}
	out := []runtime.Object{controllertest.Node(node)}
	for _, s := range controllertest.OnDemandSlices(t, server, node, layout, onDemand...) {
		out = append(out, s)
	}
	return out
}

// heldBy is a claim allocated elsewhere (kube-scheduler, a controller that
// ran before) holding the partitions of pool node.
func heldBy(name, node string, partitions ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{migRequest("r", int64(len(partitions)))}}}}
	var results []resourceapi.DeviceRequestAllocationResult
	for _, p := range partitions {
		results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver.Name, Pool: node, Device: p})
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

// A burst of claims of mixed profiles (by name and by minimum memory, one
// asking for two) on an A100 node partitioned on demand: all are placed,
// no two partitions overlap and no GPU's counters are exceeded; the first
// 1g goes to slice 6, keeping the 4g possible, as its event says.
func TestOnDemandBurstNoOverlap(t *testing.T) {
	h := newHarness(t, objs(classes(), onDemandNode(t, "dgxa100", "a100", 0, 1, 2, 3, 4, 5, 6, 7))...).start()
	h.migClaim("first", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	if got := devicesOf(h.waitAllocated("first")); len(got) != 1 || got[0] != "gpu-0-part-1g-5gb-at-6" {
		t.Fatalf("first 1g.5gb got %v, want gpu-0-part-1g-5gb-at-6", got)
	}
	e := h.waitEvent(ns+"/p-first", report.ReasonAllocated)
	if !strings.Contains(e.Note, "placed 1g.5gb at memory slice 6 of gpu-0; keeps a 4g, a 3g possible there") {
		t.Errorf("allocated event %q does not say where the partition went and why", e.Note)
	}
	var names []string
	add := func(name string, req resourceapi.DeviceRequest) {
		h.migClaim(name, req)
		names = append(names, name)
	}
	for i := range 12 {
		add(fmt.Sprintf("one-%d", i), migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	}
	for i := range 6 {
		add(fmt.Sprintf("two-%d", i), migRequest("mig", 1, controllertest.ProfileSelector("2g.10gb")))
	}
	for i := range 3 {
		add(fmt.Sprintf("three-%d", i), migRequest("mig", 1, controllertest.ProfileSelector("3g.20gb")))
	}
	add("mem", migRequest("mig", 1, minMemorySelector("15Gi")))
	add("pair", migRequest("mig", 2, controllertest.ProfileSelector("1g.5gb")))
	add("four", migRequest("mig", 1, controllertest.ProfileSelector("4g.20gb")))
	for _, n := range names {
		for _, d := range devicesOf(h.waitAllocated(n)) {
			if !driver.IsPartitionDeviceName(d) {
				t.Errorf("claim %s got %s, not a partition", n, d)
			}
		}
	}
	if got := devicesOf(h.getClaim("pair")); len(got) != 2 || got[0] == got[1] {
		t.Errorf("pair got %v, want two partitions", got)
	}
	h.checkInvariants()
}

// A 7g request waits while a 1g sits on each GPU (allocated by someone
// else, and counted from the claims as after a restart), with an event
// that says why and what the GPUs can still host; it is placed once one
// GPU's claim goes, so the counters are freed with the claim.
func TestOnDemandFullGPUWaitsForFreeCounters(t *testing.T) {
	h := newHarness(t, objs(classes(), onDemandNode(t, "dgxa100", "a100", 0, 1),
		[]runtime.Object{heldBy("held-0", "a100", "gpu-0-part-1g-5gb-at-0"), heldBy("held-1", "a100", "gpu-1-part-1g-5gb-at-3")})...).start()
	h.migClaim("full", migRequest("mig", 1, controllertest.ProfileSelector("7g.40gb")))
	e := h.waitEvent(ns+"/p-full", report.ReasonWaiting)
	for _, want := range []string{"no partition on node a100 that matches it fits beside the partitions allocated", "still possible: gpu-0,gpu-1: a 3g, 2 2g"} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("waiting event %q does not say %q", e.Note, want)
		}
	}
	// A 1g still fits beside the held ones, never on top of them.
	h.migClaim("small", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	if got := devicesOf(h.waitAllocated("small")); len(got) != 1 || got[0] == "gpu-0-part-1g-5gb-at-0" || got[0] == "gpu-1-part-1g-5gb-at-3" {
		t.Fatalf("1g.5gb got %v", got)
	}
	if a := h.getClaim("full").Status.Allocation; a != nil {
		t.Fatalf("7g allocated beside a 1g: %v", a.Devices.Results)
	}
	// Which GPU "small" packed onto decides which held claim frees a GPU.
	free := "held-1"
	if strings.HasPrefix(devicesOf(h.getClaim("small"))[0], "gpu-1-") {
		free = "held-0"
	}
	h.deleteClaim(free)
	got := devicesOf(h.waitAllocated("full"))
	if len(got) != 1 || !strings.HasSuffix(got[0], "-part-7g-40gb-at-0") {
		t.Fatalf("7g.40gb got %v", got)
	}
	h.checkInvariants()
}

// GPUs partitioned on demand are never given out whole or in shares: the
// whole-GPU and share classes see only the node's other GPUs, and a node
// mixes both.
func TestOnDemandGPUsNeverWhole(t *testing.T) {
	h := newHarness(t, objs(classes(), onDemandNode(t, "dgxa100", "a100", 0, 1))...).start()
	h.claim("seven", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 7)}})
	h.pod("p-seven", true, "seven")
	h.waitEvent(ns+"/p-seven", report.ReasonWaiting)
	h.claim("six", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 6)}})
	h.pod("p-six", true, "six")
	if got := strings.Join(devicesOf(h.waitAllocated("six")), ","); got != "gpu-2,gpu-3,gpu-4,gpu-5,gpu-6,gpu-7" {
		t.Fatalf("six whole GPUs got %s, want GPUs 2-7", got)
	}
	h.migClaim("part", migRequest("mig", 1, controllertest.ProfileSelector("3g.20gb")))
	if got := devicesOf(h.waitAllocated("part")); len(got) != 1 || !driver.IsPartitionDeviceName(got[0]) {
		t.Fatalf("3g.20gb got %v", got)
	}
	h.claim("share", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}})
	h.pod("p-share", true, "share")
	h.waitEvent(ns+"/p-share", report.ReasonWaiting)
	if a := h.getClaim("seven").Status.Allocation; a != nil {
		t.Fatalf("seven allocated %v", a.Devices.Results)
	}
	h.checkInvariants()
}

// Static MIG devices and partitions on one node: a free device that exists
// goes first (it costs no placement), then partitions; a minimum-memory
// request takes the partition that keeps the most.
func TestOnDemandBesideStaticMIG(t *testing.T) {
	layout := map[int][]string{0: {"1g.5gb"}, 1: nil}
	objects := []runtime.Object{controllertest.Node("a100")}
	for _, s := range controllertest.OnDemandSlices(t, "dgxa100", "a100", layout, 1) {
		objects = append(objects, s)
	}
	h := newHarness(t, objs(classes(), objects)...).start()
	h.migClaim("static", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	if got := devicesOf(h.waitAllocated("static")); len(got) != 1 || got[0] != "gpu-0-mig-0-0" {
		t.Fatalf("first 1g.5gb got %v, want the existing gpu-0-mig-0-0", got)
	}
	h.migClaim("mem", migRequest("mig", 1, minMemorySelector("9Gi")))
	// 1g.10gb at 6 (slices 6-7) keeps a 4g and six 1g possible; a 2g.10gb
	// at 4 only five 1g.
	if got := devicesOf(h.waitAllocated("mem")); len(got) != 1 || got[0] != "gpu-1-part-1g-10gb-at-6" {
		t.Fatalf("9Gi got %v, want gpu-1-part-1g-10gb-at-6", got)
	}
	h.checkInvariants()
}

// The NVIDIA device plugin's mixed-strategy request, nvidia.com/mig-1g.10gb:
// 2, as the compat webhook translates it, gets two 1g.10gb partitions of an
// H100 node partitioned on demand, side by side on one GPU.
func TestOnDemandTranslatedMIGRequest(t *testing.T) {
	tr := compat.Translator{Config: compat.DefaultConfig()}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "main", Image: "busybox",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("2")}},
	}}}}
	res, err := tr.Translate(pod)
	if err != nil || res == nil || len(res.Claims) != 1 {
		t.Fatalf("translating nvidia.com/mig-1g.10gb: 2: %+v %v", res, err)
	}
	spec := res.Templates[res.Claims[0].Template]
	h := newHarness(t, objs(classes(), onDemandNode(t, "dgxh100", "h100", 0, 1, 2, 3))...).start()
	h.claim("compat", spec.Spec.Devices)
	h.pod("p-compat", true, "compat")
	got := devicesOf(h.waitAllocated("compat"))
	// Slices 0-3 stay whole for a 4g; 4 and 5 lose the same (the 2g at
	// 4), so the lower start.
	if strings.Join(got, ",") != "gpu-0-part-1g-10gb-at-6,gpu-0-part-1g-10gb-at-4" {
		t.Fatalf("two 1g.10gb got %v, want slices 6 then 4 of gpu-0 (a 4g stays possible)", got)
	}
	h.checkInvariants()
}

// Nodes: the one where the partition costs the least headroom. On node a
// a 3g holds slices 4-7, so any 1g kills the 4g left on 0-3; on node b a
// 1g at 6 leaves room for a 1g that keeps the 4g.
func TestOnDemandNodeKeepsLargest(t *testing.T) {
	h := newHarness(t, objs(classes(), onDemandNode(t, "dgxa100", "a", 0), onDemandNode(t, "dgxa100", "b", 0),
		[]runtime.Object{heldBy("held-a", "a", "gpu-0-part-3g-20gb-at-4"), heldBy("held-b", "b", "gpu-0-part-1g-5gb-at-6")})...).start()
	h.migClaim("small", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	c := h.waitAllocated("small")
	if r := c.Status.Allocation.Devices.Results[0]; r.Pool != "b" || r.Device != "gpu-0-part-1g-5gb-at-4" {
		t.Fatalf("1g.5gb got %s/%s, want b/gpu-0-part-1g-5gb-at-4", r.Pool, r.Device)
	}
	h.checkInvariants()
}
