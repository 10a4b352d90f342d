package controller

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// railNICs are one NIC per PCIe root of nicNode's pcie-switch-8 layout:
// nic-k (rail k by position) under the root of GPUs 2k and 2k+1.
func railNICs() []controllertest.NIC {
	roots := []string{"pci0000:00", "pci0000:20", "pci0000:80", "pci0000:a0"}
	out := make([]controllertest.NIC, len(roots))
	for k, r := range roots {
		out[k] = controllertest.NIC{Name: fmt.Sprintf("nic-%d", k), PCIeRoot: r}
	}
	return out
}

// nicGangPod creates a gated pod of a label gang whose claim asks for 2
// GPUs and 1 NIC under one PCIe root.
func (h *harness) nicGangPod(name, gangName string, size int, extra map[string]string) {
	h.t.Helper()
	h.claim(name, gpusAndNICs(2, 1))
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{gangs.LabelGang: gangName, gangs.LabelSize: strconv.Itoa(size)}},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	for k, v := range extra {
		p.Labels[k] = v
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// nicOf returns "node/nic" of a claim's one NIC.
func nicOf(t *testing.T, c *resourceapi.ResourceClaim) string {
	t.Helper()
	got := resultsOf(c, controllertest.NICDriver)
	if len(got) != 1 {
		t.Fatalf("claim %s: NICs %v, want 1", c.Name, got)
	}
	return got[0]
}

// TestGangRailsAligned: without the option a gang's two pods of 2 GPUs
// and a NIC share one node (on different rails); with gang-rails: aligned
// they get NICs of one rail on two nodes, not rail 0, which is taken on
// node a (with its GPUs 0-1) and which the planner's first choice on
// node b would use.
func TestGangRailsAligned(t *testing.T) {
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.NICDeviceClass()},
		nicNode(t, "a", railNICs()), nicNode(t, "b", railNICs()))...).start()
	// A singleton holds a's GPUs 0-1 and their NIC, nic-0 (rail 0).
	h.claim("single", gpusAndNICs(2, 1))
	single := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "single", Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}, NodeSelector: map[string]string{corev1.LabelHostname: "a"},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("single")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, single, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := nicOf(t, h.waitAllocated("single")); got != "a/nic-0" {
		t.Fatalf("singleton got %s, want a/nic-0", got)
	}

	h.nicGangPod("u0", "unaligned", 2, nil)
	h.nicGangPod("u1", "unaligned", 2, nil)
	h.waitUngated("u0")
	h.waitUngated("u1")
	n0, n1 := nicOf(t, h.getClaim("u0")), nicOf(t, h.getClaim("u1"))
	if nodeOf0, _, _ := strings.Cut(n0, "/"); !strings.HasPrefix(n1, nodeOf0+"/") {
		t.Fatalf("gang without rail alignment on %s and %s, want both on one node", n0, n1)
	}
	for _, name := range []string{"u0", "u1"} {
		if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.eventually("b's devices free again", func() bool {
		for _, c := range h.allClaims() {
			if c.Name == "u0" || c.Name == "u1" {
				return false
			}
		}
		return true
	})

	aligned := map[string]string{gangs.LabelRails: gangs.RailsAligned}
	h.nicGangPod("r0", "rails", 2, aligned)
	h.nicGangPod("r1", "rails", 2, aligned)
	h.waitUngated("r0")
	h.waitUngated("r1")
	n0, n1 = nicOf(t, h.getClaim("r0")), nicOf(t, h.getClaim("r1"))
	node0, nic0, _ := strings.Cut(n0, "/")
	node1, nic1, _ := strings.Cut(n1, "/")
	if node0 == node1 || nic0 != nic1 || nic0 == "nic-0" {
		t.Errorf("aligned gang got %s and %s, want the same NIC rail (not rail 0, taken on a) on nodes a and b", n0, n1)
	}
	if e := h.waitEvent(ns+"/r0", report.ReasonGangPlaced); !contains(e.Note, "NIC rails "+controllertest.NICDriver+"=") {
		t.Errorf("placed event %q does not name the rails", e.Note)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// TestGangRailsAttribute: with --gang-rail-attribute a NIC's rail is what
// its driver publishes. Nodes whose free NICs are on different rails
// cannot hold an aligned gang: it waits, holding nothing, and is placed
// once a common rail is free.
func TestGangRailsAttribute(t *testing.T) {
	railed := func(node string, rails ...int64) []runtime.Object {
		o := nicNode(t, node, railNICs())
		for _, obj := range o {
			if s, ok := obj.(*resourceapi.ResourceSlice); ok && s.Spec.Driver == controllertest.NICDriver {
				for i := range s.Spec.Devices {
					s.Spec.Devices[i].Attributes["rail"] = resourceapi.DeviceAttribute{IntValue: ptr.To(rails[i])}
				}
			}
		}
		return o
	}
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{RailAttribute: controllertest.NICDriver + "/rail"}}
	// Node b cables its NICs in reverse: nic-3 is rail 0.
	h := newHarnessWith(t, cfg, objs(classes(), []runtime.Object{controllertest.NICDeviceClass()},
		railed("a", 0, 1, 2, 3), railed("b", 3, 2, 1, 0))...).start()
	// Hold a's rails 1-3 and b's rails 0-2 (nic-1..3 of a, nic-1..3 of b):
	// a offers rail 0 only, b rail 3 only.
	for i, held := range []string{"a/nic-1", "a/nic-2", "a/nic-3", "b/nic-1", "b/nic-2", "b/nic-3"} {
		node, nic, _ := strings.Cut(held, "/")
		h.claim(fmt.Sprintf("held-%d", i), resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.NICRequest("nic", 1)}})
		c := h.getClaim(fmt.Sprintf("held-%d", i))
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "nic", Driver: controllertest.NICDriver, Pool: node, Device: nic}}}}
		if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	aligned := map[string]string{gangs.LabelRails: gangs.RailsAligned}
	h.nicGangPod("r0", "rails", 2, aligned)
	h.nicGangPod("r1", "rails", 2, aligned)
	h.waitEventWith(ns+"/r0", report.ReasonGangWaiting, "counted per NIC rail")
	h.settle()
	if nodes := h.allocatedNodes("r0", "r1"); nodes["r0"] != "" || nodes["r1"] != "" {
		t.Fatalf("aligned gang allocated on %v with no rail free on both nodes", nodes)
	}
	// Freeing a's nic-3 (rail 3), which b offers too, makes room.
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, "held-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.ctrl.enqueueWaiting()
	h.waitUngated("r0")
	h.waitUngated("r1")
	got := []string{nicOf(t, h.getClaim("r0")), nicOf(t, h.getClaim("r1"))}
	slices.Sort(got)
	if want := []string{"a/nic-3", "b/nic-0"}; !slices.Equal(got, want) {
		t.Errorf("aligned gang got NICs %v, want %v (rail 3 on both nodes)", got, want)
	}
}

func TestRailKeys(t *testing.T) {
	for _, tc := range []struct{ a, b string }{{"nic-2", "nic-10"}, {"mlx5_1", "mlx5_9"}, {"a", "b"}, {"nic-02", "nic-3"}, {"x1y2", "x1y10"}} {
		if naturalCompare(tc.a, tc.b) >= 0 || naturalCompare(tc.b, tc.a) <= 0 {
			t.Errorf("naturalCompare(%s, %s) does not put %s first", tc.a, tc.b, tc.a)
		}
	}
	if naturalCompare("nic-1", "nic-1") != 0 {
		t.Error("equal names differ")
	}
	got := parseRailKey("a.example.com=0,3;b.example.com=x")
	if len(got) != 2 || !got["a.example.com"].Has("3") || !got["b.example.com"].Has("x") || got["a.example.com"].Has("1") {
		t.Errorf("parseRailKey: %v", got)
	}
}

// railGang places an aligned gang "rails" of 2 pods (2 GPUs and a NIC
// each), r0 and r1, bound on nodes a and b, on a rail other than 0:
// singletons hold rail 0 (GPUs 0-1 and nic-0) on a and b, and node c is
// busy meanwhile. Then c is freed: its first plan takes rail 0. It
// returns the harness, the gang's rail (the NIC's name) and r0's NIC.
func railGang(t *testing.T) (*harness, string, string) {
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.NICDeviceClass()},
		nicNode(t, "a", railNICs()), nicNode(t, "b", railNICs()), nicNode(t, "c", railNICs()))...).start()
	pinned := func(name, node string, claim resourceapi.DeviceClaim) {
		h.claim(name, claim)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}, NodeSelector: map[string]string{corev1.LabelHostname: node},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}}
		if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.waitAllocated(name)
	}
	for _, node := range []string{"a", "b"} {
		pinned("single-"+node, node, gpusAndNICs(2, 1))
		if got := nicOf(t, h.getClaim("single-"+node)); got != node+"/nic-0" {
			t.Fatalf("singleton got %s, want %s/nic-0", got, node)
		}
	}
	pinned("busy-c", "c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}})

	h.nicGangPod("r0", "rails", 2, railsAligned)
	h.nicGangPod("r1", "rails", 2, railsAligned)
	h.waitUngated("r0")
	h.waitUngated("r1")
	n0, n1 := nicOf(t, h.getClaim("r0")), nicOf(t, h.getClaim("r1"))
	node0, rail, _ := strings.Cut(n0, "/")
	if _, nic1, _ := strings.Cut(n1, "/"); nic1 != rail || rail == "nic-0" {
		t.Fatalf("aligned gang got %s and %s, want one rail other than 0", n0, n1)
	}
	h.bind("r0", node0)
	h.bind("r1", allocatedNode(h.getClaim("r1")))
	h.waitControllerSeesPlaced("r0", "r1")

	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "busy-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, "busy-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("c's GPUs free again", func() bool {
		free, _ := h.ctrl.planner.GPUCounts("c")
		return free == 8
	})
	return h, rail, n0
}

var railsAligned = map[string]string{gangs.LabelRails: gangs.RailsAligned}

// TestGangReplacementKeepsRails: a replacement for a lost pod of a gang
// with gang-rails: aligned takes a NIC of the rail its placed pod uses,
// not the rail an idle node offers first (rail 0 on c); where no node
// offers that rail it waits, saying so.
func TestGangReplacementKeepsRails(t *testing.T) {
	h, rail, n0 := railGang(t)
	h.deletePod("r1")
	h.nicGangPod("r2", "rails", 2, railsAligned)
	h.waitUngated("r2")
	if _, nic2, _ := strings.Cut(nicOf(t, h.getClaim("r2")), "/"); nic2 != rail {
		t.Fatalf("replacement got %s, want rail %s as its placed pod (%s)", nicOf(t, h.getClaim("r2")), rail, n0)
	}

	// r2 is lost too; the claims of the lost pods keep their NICs, so no
	// node offers that rail now: the next replacement waits, though other
	// rails are free.
	h.deletePod("r2")
	h.nicGangPod("r3", "rails", 2, railsAligned)
	h.waitEventWith(ns+"/r3", report.ReasonGangWaiting, "its pods placed before use NIC rails "+controllertest.NICDriver+"=")
	if n := allocatedNode(h.getClaim("r3")); n != "" {
		t.Errorf("replacement placed on %s off its gang's rail", n)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// TestGangFurtherPodKeepsRails: a pod beyond minCount of an aligned gang,
// placed on its own, takes a NIC of its placed pods' rail too (on c, not
// c's rail 0); with that rail taken everywhere, the next one waits, and
// takes that rail's NIC once it is let go (its nodes without room are
// kept between retries, planner.HeldOff: not past such a change).
func TestGangFurtherPodKeepsRails(t *testing.T) {
	h, rail, n0 := railGang(t)
	h.nicGangPod("r2", "rails", 2, railsAligned)
	h.waitUngated("r2")
	if got := nicOf(t, h.getClaim("r2")); got != "c/"+rail {
		t.Fatalf("further pod got %s, want c/%s, the rail of its placed pods (%s)", got, rail, n0)
	}
	h.nicGangPod("r3", "rails", 2, railsAligned)
	h.waitEventWith(ns+"/r3", report.ReasonWaiting, "NIC rails "+controllertest.NICDriver+"=")
	if n := allocatedNode(h.getClaim("r3")); n != "" {
		t.Errorf("further pod placed on %s off its gang's rail", n)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}

	// r2 ends and its claim goes: c's NIC of the rail is free again.
	h.deletePod("r2")
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, "r2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitUngated("r3")
	if got := nicOf(t, h.getClaim("r3")); got != "c/"+rail {
		t.Fatalf("waiting further pod got %s once c/%s was let go, want that NIC", got, rail)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}
