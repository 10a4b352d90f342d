package controller

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// migRequest asks for count MIG devices of the MIG class matching the
// selectors.
func migRequest(name string, count int64, selectors ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassMIG, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return r
}

func minMemorySelector(q string) string {
	return `device.capacity["` + driver.Name + `"].memory.compareTo(quantity("` + q + `")) >= 0`
}

// migClaim creates a claim of requests and a gated pod using it, named
// after the claim.
func (h *harness) migClaim(name string, reqs ...resourceapi.DeviceRequest) {
	h.t.Helper()
	h.claim(name, resourceapi.DeviceClaim{Requests: reqs})
	h.pod("p-"+name, true, name)
}

// checkInvariants fails the test when any device is given out twice.
func (h *harness) checkInvariants() {
	h.t.Helper()
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		h.t.Error(err)
	}
}

// A profile selector gets a device of that profile, exclusively: the
// second claim on the node's only 1g.5gb waits, naming the profile.
func TestMIGClaimByProfile(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.Node("a100"),
		controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb", "3g.20gb"}, 1: {"7g.40gb"}})})...).start()
	h.migClaim("small", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	c := h.waitAllocated("small")
	if got := devicesOf(c); len(got) != 1 || got[0] != "gpu-0-mig-0-0" {
		t.Fatalf("1g.5gb claim got %v, want gpu-0-mig-0-0", got)
	}
	if r := c.Status.Allocation.Devices.Results[0]; r.ShareID != nil || r.Pool != "a100" || r.Request != "mig" {
		t.Errorf("result %+v, want a dedicated result of request mig in pool a100", r)
	}
	h.waitUngated("p-small")
	if e := h.waitEvent(ns+"/p-small", report.ReasonAllocated); !strings.Contains(e.Note, "gpu-0-mig-0-0 (1g.5gb)") {
		t.Errorf("allocated event %q does not name the MIG device and its profile", e.Note)
	}

	h.migClaim("again", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	e := h.waitEvent(ns+"/p-again", report.ReasonWaiting)
	if !strings.Contains(e.Note, `profile == "1g.5gb"`) || !strings.Contains(e.Note, "in use") {
		t.Errorf("waiting event %q does not say the matching 1g.5gb device is in use", e.Note)
	}
	// A profile the node does not have: the event names it.
	h.migClaim("absent", migRequest("mig", 1, controllertest.ProfileSelector("1g.10gb")))
	e = h.waitEvent(ns+"/p-absent", report.ReasonWaiting)
	if !strings.Contains(e.Note, `profile == "1g.10gb"`) || !strings.Contains(e.Note, "no MIG device on node a100 matches") {
		t.Errorf("waiting event %q does not name the missing profile", e.Note)
	}
	for _, n := range []string{"again", "absent"} {
		if a := h.getClaim(n).Status.Allocation; a != nil {
			t.Errorf("claim %s allocated %+v", n, a.Devices.Results)
		}
	}
	h.checkInvariants()
}

// A minimum-memory selector takes the smallest device that satisfies it,
// and a count of 2 two distinct devices.
func TestMIGClaimByMemoryWastesLeast(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.Node("a100"),
		controllertest.MIGSlice(t, "a100", map[int][]string{0: {"7g.40gb"}, 1: {"3g.20gb"}, 2: {"2g.10gb"}, 3: {"1g.5gb"}})})...).start()
	// 2g.10gb has 9856Mi: at least 9Gi matches it, the 3g and the 7g.
	h.migClaim("nine", migRequest("mig", 1, minMemorySelector("9Gi")))
	if got := devicesOf(h.waitAllocated("nine")); len(got) != 1 || got[0] != "gpu-2-mig-0-0" {
		t.Fatalf("9Gi claim got %v, want gpu-2-mig-0-0 (2g.10gb), the smallest that fits", got)
	}
	h.migClaim("two", migRequest("mig", 2, minMemorySelector("9Gi")))
	got := devicesOf(h.waitAllocated("two"))
	if strings.Join(got, ",") != "gpu-1-mig-0-0,gpu-0-mig-0-0" {
		t.Fatalf("two 9Gi devices got %v, want the 3g.20gb then the 7g.40gb", got)
	}
	h.checkInvariants()
}

// Among equal free devices, one on a GPU that already has allocated MIG
// devices is taken first, so that idle GPUs stay whole for large profiles.
func TestMIGPacksOntoBusyGPUs(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.Node("a100"),
		controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb", "1g.5gb"}, 1: {"1g.5gb", "3g.20gb"}})})...).start()
	h.migClaim("big", migRequest("mig", 1, controllertest.ProfileSelector("3g.20gb")))
	if got := devicesOf(h.waitAllocated("big")); len(got) != 1 || !strings.HasPrefix(got[0], "gpu-1-mig-") {
		t.Fatalf("3g.20gb claim got %v, want GPU 1's", got)
	}
	h.migClaim("small", migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb")))
	if got := devicesOf(h.waitAllocated("small")); len(got) != 1 || got[0] != "gpu-1-mig-0-0" {
		t.Fatalf("1g.5gb claim got %v, want gpu-1-mig-0-0 on the busy GPU 1, not GPU 0 (idle)", got)
	}
	// Two more 1g.5gb in one claim: only GPU 0's are left.
	h.migClaim("pair", migRequest("mig", 2, controllertest.ProfileSelector("1g.5gb")))
	if got := devicesOf(h.waitAllocated("pair")); len(got) != 2 || !strings.HasPrefix(got[0], "gpu-0-mig-") || !strings.HasPrefix(got[1], "gpu-0-mig-") || got[0] == got[1] {
		t.Fatalf("pair got %v, want GPU 0's two 1g.5gb devices", got)
	}
	h.migClaim("none", migRequest("mig", 1))
	h.waitEvent(ns+"/p-none", report.ReasonWaiting)
	h.checkInvariants()
}

// Nodes: the one whose GPUs are already busy is packed first.
func TestMIGPacksNodes(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{
		controllertest.Node("a"), controllertest.MIGSlice(t, "a", map[int][]string{0: {"1g.5gb", "1g.5gb"}}),
		controllertest.Node("b"), controllertest.MIGSlice(t, "b", map[int][]string{0: {"1g.5gb", "1g.5gb"}}),
	})...).start()
	h.migClaim("one", migRequest("mig", 1))
	first := h.waitAllocated("one").Status.Allocation.Devices.Results[0].Pool
	h.migClaim("two", migRequest("mig", 1))
	if second := h.waitAllocated("two").Status.Allocation.Devices.Results[0].Pool; second != first {
		t.Errorf("second MIG claim went to node %s, want %s where the first is (pack)", second, first)
	}
	h.checkInvariants()
}

// A node whose GPUs are all in MIG mode gives neither whole GPUs nor
// shares; a MIG claim never gets a whole GPU.
func TestMIGAndWholeNeverMix(t *testing.T) {
	layout := map[int][]string{}
	for i := range 8 {
		layout[i] = []string{"7g.40gb"}
	}
	h := newHarness(t, objs(classes(), []runtime.Object{
		controllertest.Node("mig"), controllertest.MIGSlice(t, "mig", layout),
		controllertest.Node("whole"), controllertest.MIGSlice(t, "whole", nil),
	})...).start()
	h.migClaim("whole", controllertest.WholeRequest("gpu", 8))
	if c := h.waitAllocated("whole"); c.Status.Allocation.Devices.Results[0].Pool != "whole" {
		t.Fatalf("8 whole GPUs on pool %s, want node whole", c.Status.Allocation.Devices.Results[0].Pool)
	}
	h.migClaim("share", controllertest.ShareRequest("gpu", "1Gi", ""))
	h.waitEvent(ns+"/p-share", report.ReasonWaiting)
	h.migClaim("more", controllertest.WholeRequest("gpu", 1))
	h.waitEvent(ns+"/p-more", report.ReasonWaiting)
	h.migClaim("mig", migRequest("mig", 8))
	for _, d := range devicesOf(h.waitAllocated("mig")) {
		if !driver.IsMIGDeviceName(d) {
			t.Errorf("MIG claim got %s, not a MIG device", d)
		}
	}
	h.migClaim("mig9", migRequest("mig", 1))
	h.waitEvent(ns+"/p-mig9", report.ReasonWaiting)
	for _, n := range []string{"share", "more", "mig9"} {
		if a := h.getClaim(n).Status.Allocation; a != nil {
			t.Errorf("claim %s allocated %+v", n, a.Devices.Results)
		}
	}
	h.checkInvariants()
}

// A claim mixing MIG devices and whole GPUs, and a MIG request asking for
// capacity, are refused naming what is wrong.
func TestMIGRefusals(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.Node("a100"),
		controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb"}})})...).start()
	h.migClaim("mixed", migRequest("mig", 1), controllertest.WholeRequest("gpu", 1))
	if e := h.waitEvent(ns+"/p-mixed", report.ReasonUninterpretable); !strings.Contains(e.Note, "claim default/mixed asks for MIG devices (requests mig) and for whole GPUs or shares (requests gpu)") {
		t.Errorf("event %q does not name the claim and its requests", e.Note)
	}
	capReq := migRequest("mig", 1)
	capReq.Exactly.Capacity = controllertest.ShareRequest("x", "1Gi", "").Exactly.Capacity
	h.migClaim("capacity", capReq)
	if e := h.waitEvent(ns+"/p-capacity", report.ReasonUninterpretable); !strings.Contains(e.Note, "capacity.requests") || !strings.Contains(e.Note, driver.DeviceClassMIG) {
		t.Errorf("event %q does not name the field and the class", e.Note)
	}
}

// A pod with a MIG claim, a whole-GPU claim and a share claim gets all
// three on the one node that has both kinds, a GPU in MIG mode given out
// as its MIG device only.
func TestMIGWithWholeAndShareClaimsInOnePod(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{
		controllertest.Node("a100"), controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb"}}),
		controllertest.Node("plain"), controllertest.MIGSlice(t, "plain", nil),
	})...).start()
	h.claim("m", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{migRequest("mig", 1, controllertest.ProfileSelector("1g.5gb"))}})
	h.claim("w", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 1)}})
	h.claim("s", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("gpu", "1Gi", "10")}})
	h.pod("p", true, "w", "m", "s")
	h.waitUngated("p")
	m, w, s := h.getClaim("m"), h.getClaim("w"), h.getClaim("s")
	for _, c := range []*resourceapi.ResourceClaim{m, w, s} {
		if c.Status.Allocation == nil || c.Status.Allocation.Devices.Results[0].Pool != "a100" {
			t.Fatalf("claim %s: allocation %+v, want one on node a100", c.Name, c.Status.Allocation)
		}
	}
	if got := devicesOf(m); len(got) != 1 || got[0] != "gpu-0-mig-0-0" {
		t.Errorf("MIG claim got %v, want gpu-0-mig-0-0", got)
	}
	for _, c := range []*resourceapi.ResourceClaim{w, s} {
		if got := devicesOf(c); len(got) != 1 || got[0] == "gpu-0" || driver.IsMIGDeviceName(got[0]) {
			t.Errorf("claim %s got %v, want one GPU not in MIG mode", c.Name, got)
		}
	}
	h.checkInvariants()
}

// Before any slice exists, a MIG claim is gpulink's (it waits) and not
// handed to kube-scheduler.
func TestMIGClassSelectsGpulinkWithoutSlices(t *testing.T) {
	ev := planner.NewSelectorEvaluator()
	for _, c := range planner.DeviceClasses() {
		c.ResourceVersion = "1"
		ok, err := ev.ClassSelectsGpulink(context.Background(), c, planner.NewInventory())
		if err != nil || !ok {
			t.Errorf("class %s selects gpulink devices: %v, %v; want true", c.Name, ok, err)
		}
	}
	other := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "other", ResourceVersion: "1"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "other"`}}}}}
	if ok, _ := ev.ClassSelectsGpulink(context.Background(), other, planner.NewInventory()); ok {
		t.Error("another driver's class counts as gpulink's")
	}
}

// deployments/deviceclasses/deviceclasses.yaml carries DeviceClasses()
// (the e2e suite checks the chart against the same file).
func TestDeviceClassesManifestMatchesGo(t *testing.T) {
	data, err := os.ReadFile("../deployments/deviceclasses/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file []resourceapi.DeviceClass
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var dc resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
			t.Fatalf("deviceclasses.yaml: %v", err)
		}
		file = append(file, dc)
	}
	want := planner.DeviceClasses()
	if len(file) != len(want) {
		t.Fatalf("the manifest has %d DeviceClasses, DeviceClasses() %d", len(file), len(want))
	}
	for i, w := range want {
		f := file[i]
		if f.Name != w.Name || !reflect.DeepEqual(f.Labels, w.Labels) {
			t.Errorf("DeviceClass %d: %s %v in the manifest, %s %v in Go", i, f.Name, f.Labels, w.Name, w.Labels)
		}
		if !apiequality.Semantic.DeepEqual(f.Spec, w.Spec) {
			t.Errorf("DeviceClass %s: spec %+v in the manifest, %+v in Go", w.Name, f.Spec, w.Spec)
		}
	}
}

// The report (gpulink inspect) shows each GPU's MIG layout and who holds
// each MIG device; a MIG device held twice or shared is a problem.
func TestBuildReportMIG(t *testing.T) {
	s := controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb", "3g.20gb"}, 1: {"7g.40gb"}})
	held := func(name, dev string, share bool) *resourceapi.ResourceClaim {
		r := resourceapi.DeviceRequestAllocationResult{Request: "mig", Driver: driver.Name, Pool: "a100", Device: dev}
		if share {
			id := types.UID("s1")
			r.ShareID = &id
		}
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}}}}}
	}
	reports := report.Build([]*resourceapi.ResourceSlice{s}, []*resourceapi.ResourceClaim{
		held("small", "gpu-0-mig-0-0", false), held("twice-a", "gpu-1-mig-0-0", false), held("twice-b", "gpu-1-mig-0-0", false),
		held("shared", "gpu-0-mig-1-0", true),
	})
	if len(reports) != 1 {
		t.Fatalf("%d reports", len(reports))
	}
	r := reports[0]
	if len(r.GPUs) != 6 || len(r.UnknownDevices) != 0 {
		t.Errorf("%d GPUs, unknown devices %+v; want 6 whole GPUs and every MIG device known", len(r.GPUs), r.UnknownDevices)
	}
	var got []string
	for _, m := range r.MIG {
		var holders []string
		for _, h := range m.Holders {
			holders = append(holders, h.Name)
		}
		got = append(got, fmt.Sprintf("%s %s gpu%d %d+%d free=%v holders=%v problems=%d", m.Device, m.Profile, m.Parent, m.PlacementStart, m.PlacementSize, m.Free, holders, len(m.Problems)))
	}
	want := []string{
		"gpu-0-mig-0-0 1g.5gb gpu0 0+1 free=false holders=[small] problems=0",
		"gpu-0-mig-1-0 3g.20gb gpu0 4+4 free=false holders=[] problems=1",
		"gpu-1-mig-0-0 7g.40gb gpu1 0+8 free=false holders=[twice-a twice-b] problems=1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("MIG report:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
