package controller

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// nicNode is a pcie-switch-8 node with PCIe roots (one per PIX pair: 00,
// 20, 80, a0) and the test NIC driver's slice.
func nicNode(t testing.TB, name string, nics []controllertest.NIC) []runtime.Object {
	t.Helper()
	topo, err := controllertest.WithPCIeRoots(fixtureTopology(t, "pcie-switch-8.txt"),
		[]string{"pci0000:00", "pci0000:00", "pci0000:20", "pci0000:20", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return []runtime.Object{controllertest.Node(name), s, controllertest.NICSlice(name, nics)}
}

func gpusAndNICs(gpus, nics int64) resourceapi.DeviceClaim {
	return resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", gpus), controllertest.NICRequest("nic", nics)},
		Constraints: []resourceapi.DeviceConstraint{controllertest.MatchPCIeRoot()},
	}
}

// resultsOf returns a claim's devices of one driver.
func resultsOf(c *resourceapi.ResourceClaim, drv string) []string {
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == drv {
			out = append(out, r.Pool+"/"+r.Device)
		}
	}
	return out
}

// A claim for GPUs and the test driver's NICs with matchAttribute
// pcieRoot is allocated whole by the controller: GPUs whose root has the
// NICs, the NICs as results of their own driver, the node in the node
// selector. NICs that a claim allocated elsewhere holds, and NICs with
// taints the request does not tolerate, are not given out.
func TestGPUsWithNICs(t *testing.T) {
	taint := []resourceapi.DeviceTaint{{Key: "example.com/down", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	nics := []controllertest.NIC{
		{Name: "nic-0", PCIeRoot: "pci0000:00"}, {Name: "nic-1", PCIeRoot: "pci0000:00"},
		{Name: "nic-2", PCIeRoot: "pci0000:20", Taints: taint}, {Name: "nic-3", PCIeRoot: "pci0000:20", Taints: taint},
		{Name: "nic-4", PCIeRoot: "pci0000:80"}, {Name: "nic-5", PCIeRoot: "pci0000:80"}, {Name: "nic-6", PCIeRoot: "pci0000:80"},
		{Name: "nic-7", PCIeRoot: "pci0000:a0"},
	}
	// nic-0 is held by a claim kube-scheduler allocated (NICs only).
	held := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns, UID: "held-uid"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.NICRequest("nic", 1)}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: controllertest.NICDriver, Pool: "a", Device: "nic-0"}}}}},
	}
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.NICDeviceClass(), held}, nicNode(t, "a", nics))...).start()

	h.claim("first", gpusAndNICs(2, 2))
	h.pod("first", true, "first")
	c := h.waitAllocated("first")
	// Root 00 has one free NIC (nic-0 is held), root 20's are tainted:
	// root 80's GPUs and its two lowest-named NICs.
	if got, want := resultsOf(c, driver.Name), []string{"a/gpu-4", "a/gpu-5"}; !slices.Equal(got, want) {
		t.Errorf("GPUs %v, want %v", got, want)
	}
	if got, want := resultsOf(c, controllertest.NICDriver), []string{"a/nic-4", "a/nic-5"}; !slices.Equal(got, want) {
		t.Errorf("NICs %v, want %v", got, want)
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == controllertest.NICDriver && (r.Request != "nic" || r.ShareID != nil) {
			t.Errorf("NIC result %+v: want request nic, dedicated", r)
		}
	}
	if n := c.Status.Allocation.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0]; n != "a" {
		t.Errorf("node selector names %s, want a", n)
	}
	h.waitUngated("first")
	if e := h.waitEvent(ns+"/first", report.ReasonAllocated); !contains(e.Note, "nic=nic-4,nic-5 ("+controllertest.NICDriver+")") {
		t.Errorf("allocation event %q does not name the NICs", e.Note)
	}

	// One NIC left under root 80, one under a0, nic-1 under 00: the next
	// two-NIC claim has no root to go to, and says why.
	h.claim("second", gpusAndNICs(2, 2))
	h.pod("second", true, "second")
	e := h.waitEvent(ns+"/second", report.ReasonWaiting)
	if !contains(e.Note, "no 2 free devices of DeviceClass "+controllertest.NICClass+" under resource.kubernetes.io/pcieRoot=pci0000:00 of gpu-0,gpu-1") {
		t.Errorf("waiting event %q does not say which NICs are missing", e.Note)
	}
	// With a toleration of the taint, root 20 serves it.
	tolerating := gpusAndNICs(2, 2)
	tolerating.Requests[1].Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: "example.com/down", Operator: resourceapi.DeviceTolerationOpExists}}
	h.claim("third", tolerating)
	h.pod("third", true, "third")
	c = h.waitAllocated("third")
	if got, want := resultsOf(c, controllertest.NICDriver), []string{"a/nic-2", "a/nic-3"}; !slices.Equal(got, want) {
		t.Errorf("tolerating claim got NICs %v, want %v", got, want)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// A claim with gpulink GPUs and another driver's devices of a class
// gpulink cannot evaluate gets a Warning event naming the class and field,
// and stays unallocated and gated.
func TestGPUsWithUnevaluableForeignClass(t *testing.T) {
	noSelectors := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "any.example.com"}}
	h := newHarness(t, objs(classes(), []runtime.Object{noSelectors}, nicNode(t, "a", []controllertest.NIC{{Name: "nic-0", PCIeRoot: "pci0000:00"}}))...).start()
	spec := gpusAndNICs(1, 1)
	spec.Requests[1].Exactly.DeviceClassName = noSelectors.Name
	h.claim("c", spec)
	h.pod("p", true, "c")
	e := h.waitEvent(ns+"/p", report.ReasonUninterpretable)
	if e.Type != corev1.EventTypeWarning || !contains(e.Note, `spec.devices.requests[1].exactly.deviceClassName: Invalid value: "any.example.com"`) {
		t.Errorf("event %+v: want a warning naming the request's class", e)
	}
	if h.getClaim("c").Status.Allocation != nil || gateIndex(h.getPod("p")) < 0 {
		t.Error("claim allocated or pod ungated")
	}
}

// CheckInvariants, which the tests above and the churn tests run, catches
// another driver's device given out whole to two claims.
func TestInvariantsCatchNICGivenTwice(t *testing.T) {
	nic := resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: controllertest.NICDriver, Pool: "a", Device: "nic-0"}
	a := controllertest.ClaimWith("a", "1", nic)
	b := controllertest.ClaimWith("b", "2", nic)
	err := controllertest.CheckInvariants([]resourceapi.ResourceClaim{*a, *b}, nil)
	if err == nil || !contains(err.Error(), "device "+controllertest.NICDriver+"/a/nic-0 is given out whole to 2 claims") {
		t.Fatalf("err %v, want nic-0 given out twice", err)
	}
}
