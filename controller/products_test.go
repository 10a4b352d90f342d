package controller

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// productNode is a node of fixture's topology whose GPUs name product.
func productNode(t *testing.T, name, fixture, product string) []runtime.Object {
	t.Helper()
	topo := fixtureTopology(t, fixture)
	for p := range topo.GPUs {
		topo.GPUs[p].ProductName = product
	}
	s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return []runtime.Object{controllertest.Node(name), s}
}

// Two nodes of 4 GPUs of two products. A pod whose claim selects product
// Y goes to b, the only Y node; the demand mix then holds a one-GPU shape
// pinned to Y. A pod that may run anywhere packs onto b by GPUs alone,
// and so it did with the shape recorded without its product (every node
// strands nothing for a one-GPU pod that runs anywhere). With the product
// recorded, b's GPUs are the ones the pinned shape needs and a's are
// stranded for it anyway: the pod goes to a.
func TestRankByStrandingWeighsPinnedProducts(t *testing.T) {
	for _, tc := range []struct {
		stranding bool
		want      string
	}{{false, "b"}, {true, "a"}} {
		h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, RankByStranding: tc.stranding,
			Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}},
			objs(classes(), productNode(t, "a", "pcie-4.txt", "X"), productNode(t, "b", "pcie-4.txt", "Y"))...).start()
		pinned := controllertest.WholeRequest("g", 1)
		pinned.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["` + driver.Name + `"].productName == "Y"`}}}
		h.claim("c0", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{pinned}})
		h.podAsking("pod-c0", "1", "c0")
		if held, ok, err := gpuview.ClaimDevices(h.waitAllocated("c0")); err != nil || !ok || held.Node != "b" {
			t.Fatalf("rank by stranding %v: pinned claim c0 on %+v (%v %v), want node b", tc.stranding, held, ok, err)
		}
		h.claim("c1", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
		h.podAsking("pod-c1", "1", "c1")
		held, ok, err := gpuview.ClaimDevices(h.waitAllocated("c1"))
		if err != nil || !ok {
			t.Fatalf("claim c1: %+v %v %v", held, ok, err)
		}
		if held.Node != tc.want {
			t.Errorf("rank by stranding %v: claim c1 on node %s, want %s", tc.stranding, held.Node, tc.want)
		}
	}
}
