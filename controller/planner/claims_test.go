package planner

import (
	"context"
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

func testInterpreter(t *testing.T, extra ...*resourceapi.DeviceClass) (*Interpreter, *Inventory) {
	t.Helper()
	classes := controllertest.ClassLister{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	for _, c := range extra {
		classes[c.Name] = c
	}
	inv := NewInventory()
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice("n", topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	return NewInterpreter(classes, NewSelectorEvaluator(), inv), inv
}

func claimOf(spec resourceapi.DeviceClaim) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}, Spec: resourceapi.ResourceClaimSpec{Devices: spec}}
}

func TestInterpretConfigLayers(t *testing.T) {
	// The class requires NVLink; the claim relaxes it to best effort for
	// request "a" only.
	strict := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "strict"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.gpulink.dev"`}}},
		Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","topology":{"policy":"Required","minLink":"NV2"}}`)}}}}},
	}}
	ip, _ := testInterpreter(t, strict)
	reqA := controllertest.WholeRequest("a", 2)
	reqA.Exactly.DeviceClassName = "strict"
	reqB := controllertest.WholeRequest("b", 2)
	reqB.Exactly.DeviceClassName = "strict"
	ic, kind, err := ip.Interpret(context.Background(), claimOf(resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{reqA, reqB},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","topology":{"policy":"BestEffort"}}`, "a")},
	}))
	if err != nil || kind != ClaimOurs {
		t.Fatalf("interpret: kind %d, err %v", kind, err)
	}
	if got := ic.Requests[0].Alternatives[0].RequiredLink; got != topology.LinkNone {
		t.Errorf("request a: required link %s, want none (claim relaxed the class)", got)
	}
	if got := ic.Requests[1].Alternatives[0].RequiredLink; got != topology.NVLink(2) {
		t.Errorf("request b: required link %s, want NV2 from the class", got)
	}
}

func TestInterpretShareSizesFromConfig(t *testing.T) {
	ip, inv := testInterpreter(t)
	ic, _, err := ip.Interpret(context.Background(), claimOf(resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "", "40")},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"defaultMemory":"6Gi","defaultCores":10}}`)},
	}))
	if err != nil {
		t.Fatal(err)
	}
	alt := ic.Requests[0].Alternatives[0]
	if !alt.Share {
		t.Fatal("request on the share class is not a share")
	}
	share, consumed, err := shareConsumption(inv.Node("n").Devices[0], alt)
	if err != nil {
		t.Fatal(err)
	}
	// Memory from the config's explicit default, cores from the request.
	if share.MemoryBytes != 6<<30 || share.Cores != 40 {
		t.Errorf("share %+v, want 6Gi from the config and 40 cores from the request", share)
	}
	if m := consumed[driver.CapacityMemory]; m.Value() != 6<<30 {
		t.Errorf("consumed memory %s, want 6Gi", m.String())
	}
}

func TestInterpretClassification(t *testing.T) {
	other := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "other.example.com"`}}}}}
	byAttr := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "v100s"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.gpulink.dev"].nvlinkIsland == 0`}}}}}
	noSel := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "any"}}
	ip, _ := testInterpreter(t, other, byAttr, noSel)
	req := func(class string) resourceapi.DeviceRequest {
		r := controllertest.WholeRequest("r", 1)
		r.Exactly.DeviceClassName = class
		return r
	}
	for _, tc := range []struct {
		class string
		kind  ClaimKind
	}{{"other", claimForeign}, {"v100s", ClaimOurs}, {"any", claimForeign}, {driver.DeviceClassShare, ClaimOurs}} {
		_, kind, err := ip.Interpret(context.Background(), claimOf(resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req(tc.class)}}))
		if err != nil || kind != tc.kind {
			t.Errorf("class %s: kind %d, err %v; want kind %d", tc.class, kind, err, tc.kind)
		}
	}
	_, _, err := ip.Interpret(context.Background(), claimOf(resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req("missing")}}))
	if !errors.Is(err, ErrClassMissing) {
		t.Errorf("missing class: err %v, want errClassMissing", err)
	}
	fa := resourceapi.DeviceRequest{Name: "r", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "gpu", DeviceClassName: driver.DeviceClassWhole, Count: 1},
		{Name: "nic", DeviceClassName: "other", Count: 1},
	}}
	_, _, err = ip.Interpret(context.Background(), claimOf(resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{fa}}))
	var u *uninterpretableError
	if !errors.As(err, &u) {
		t.Errorf("firstAvailable mixing drivers: err %v, want uninterpretable", err)
	}
}
