package sliceformat

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
)

// nvl72Fabric is a completed NVLink fabric registration in clique 3 of
// cluster 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0, as every GPU of a GB200
// NVL72 tray reports it.
var nvl72Fabric = nvml.GpuFabricInfo{
	ClusterUuid: [16]uint8{0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0},
	CliqueId:    3,
	State:       nvml.GPU_FABRIC_STATE_COMPLETED,
	Status:      uint32(nvml.SUCCESS),
}

const nvl72Clique = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.3"

// matches evaluates CEL selectors on a published device as kube-scheduler
// and the controller do (k8s.io/dynamic-resource-allocation/cel): a
// runtime error (an attribute the device lacks) is no match.
func matches(t *testing.T, driverName string, dev resourceapi.Device, exprs ...string) bool {
	t.Helper()
	d := dracel.Device{Driver: driverName, Attributes: dev.Attributes, Capacity: dev.Capacity, AllowMultipleAllocations: dev.AllowMultipleAllocations}
	for _, x := range exprs {
		prog := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).CompileCELExpression(x, dracel.Options{})
		if prog.Error != nil {
			t.Fatalf("%s: %v", x, prog.Error)
		}
		ok, _, err := prog.DeviceMatches(context.Background(), d)
		if err != nil || !ok {
			return false
		}
	}
	return true
}

// GPUs whose NVLink fabric registration completed publish their clique
// (cliqueID, GPU Feature Discovery's nvidia.com/gpu.clique value), their
// MIG devices too; the controller reads it back; a claim selects on it
// with CEL. GPUs without a fabric publish no cliqueID, and a selector on
// it matches none of them.
func TestCliqueAttribute(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	fabric := nvl72Fabric
	topo, err := discovery.MockTopology("dgxa100", discovery.MockOptions{Fabric: &fabric, MIG: map[int][]string{1: {"1g.5gb"}}})
	if err != nil {
		t.Fatal(err)
	}
	encoded, err := Encode(logger, testNode, topo, defaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	inClique := `device.attributes["` + driver.Name + `"].` + driver.AttrCliqueID + ` == "` + nvl72Clique + `"`
	otherClique := `device.attributes["` + driver.Name + `"].` + driver.AttrCliqueID + ` == "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.4"`
	devices := 0
	for _, s := range encoded {
		for _, d := range s {
			devices++
			a, ok := d.Attributes[driver.AttrCliqueID]
			if !ok || a.StringValue == nil || *a.StringValue != nvl72Clique {
				t.Errorf("device %s: %s = %+v, want %q", d.Name, driver.AttrCliqueID, a, nvl72Clique)
			}
			if !matches(t, driver.Name, d, inClique) {
				t.Errorf("device %s: %s does not match", d.Name, inClique)
			}
			if matches(t, driver.Name, d, otherClique) {
				t.Errorf("device %s: %s matches", d.Name, otherClique)
			}
		}
	}
	if devices != 8 { // 7 whole GPUs and GPU 1's MIG device
		t.Errorf("%d devices, want 8", devices)
	}
	pool, err := DecodePool(testNode, objects(testNode, 1, encoded))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range pool.Topology.GPUs {
		if g.Clique != nvl72Clique {
			t.Errorf("decoded GPU %d: clique %q, want %q", g.Index, g.Clique, nvl72Clique)
		}
	}

	plain, err := discovery.MockTopology("dgxa100", discovery.MockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	encoded, err = Encode(logger, testNode, plain, defaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range encoded {
		for _, d := range s {
			if a, ok := d.Attributes[driver.AttrCliqueID]; ok {
				t.Errorf("device %s without a fabric: %s = %+v, want none", d.Name, driver.AttrCliqueID, a)
			}
			if matches(t, driver.Name, d, inClique) {
				t.Errorf("device %s without a fabric: %s matches", d.Name, inClique)
			}
		}
	}
}
