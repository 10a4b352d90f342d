package sliceformat

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
)

// objects wraps encoded devices into the ResourceSlice objects of one
// pool, as the resourceslice controller publishes them.
func objects(node string, generation int64, encoded [][]resourceapi.Device) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(encoded))
	for i, devices := range encoded {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, driver.Name, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver.Name,
				Pool:     resourceapi.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: int64(len(encoded))},
				NodeName: ptr.To(node),
				Devices:  devices,
			},
		}
	}
	return out
}

// roundTrip encodes t and decodes the result.
func roundTrip(t *testing.T, topo *topology.Topology, opts Options) *Pool {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	encoded, err := Encode(logger, testNode, topo, opts)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	pool, err := DecodePool(testNode, objects(testNode, 3, encoded))
	if err != nil {
		t.Fatalf("DecodePool: %v", err)
	}
	if pool.Node != testNode || pool.Name != testNode || pool.Generation != 3 {
		t.Errorf("pool %s of node %s generation %d, want %s, %s, 3", pool.Name, pool.Node, pool.Generation, testNode, testNode)
	}
	return pool
}

// TestRoundTripEveryTopology encodes every topology fixture and checks that
// decoding gives back each GPU's identity and every pair's link: what the
// plugin publishes is what the controller plans on.
func TestRoundTripEveryTopology(t *testing.T) {
	dir := filepath.Join("..", "..", "driver", "topology", "testdata")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".txt") {
			continue
		}
		t.Run(e.Name(), func(t *testing.T) {
			topo := loadTopology(t, e.Name())
			for p := range topo.GPUs {
				topo.GPUs[p].NUMANode = p % 2
			}
			pool := roundTrip(t, topo, defaultOptions())
			assertSameTopology(t, topo, pool)
		})
	}
}

// TestRoundTripMIG checks a node that mixes GPUs in MIG mode with whole
// GPUs: the whole GPUs keep their links among themselves, and every MIG
// device its parent, profile, placement and memory.
func TestRoundTripMIG(t *testing.T) {
	for _, server := range []string{"dgxa100", "dgxh100"} {
		t.Run(server, func(t *testing.T) {
			layout := map[int][]string{0: {"1g.10gb", "3g.40gb"}, 3: {"7g.80gb"}}
			if server == "dgxa100" {
				layout = map[int][]string{0: {"1g.5gb", "3g.20gb"}, 3: {"7g.40gb"}}
			}
			topo, err := discovery.MockTopology(server, discovery.MockOptions{MIG: layout})
			if err != nil {
				t.Fatalf("MockTopology: %v", err)
			}
			pool := roundTrip(t, topo, defaultOptions())
			whole, err := wholeGPUs(topo)
			if err != nil {
				t.Fatal(err)
			}
			assertSameTopology(t, whole, pool)
			var want []MIGDevice
			for _, g := range topo.GPUs {
				if !g.MIGEnabled() {
					continue
				}
				for _, in := range g.MIG.Instances {
					want = append(want, MIGDevice{Parent: g.Index, Profile: in.Profile.Name, Placement: in.Placement, MemoryBytes: in.Profile.MemoryBytes})
				}
			}
			if len(pool.MIG) != len(want) || len(want) != 3 {
				t.Fatalf("%d MIG devices decoded, want %d (3)", len(pool.MIG), len(want))
			}
			for i, m := range pool.MIG {
				got := m
				got.Device = nil
				if got != want[i] {
					t.Errorf("MIG device %d: decoded %+v, want %+v", i, got, want[i])
				}
				if uuid, ok := Attribute(m.Device, driver.AttrParentUUID); !ok || *uuid.StringValue != topo.GPUs[m.Parent].UUID {
					t.Errorf("MIG device %s: parent UUID %v, want %s", m.Device.Name, uuid, topo.GPUs[m.Parent].UUID)
				}
			}
		})
	}
}

func assertSameTopology(t *testing.T, want *topology.Topology, pool *Pool) {
	t.Helper()
	got := pool.Topology
	if got.Len() != want.Len() || len(pool.GPUs) != want.Len() {
		t.Fatalf("decoded %d GPUs (%d devices), encoded %d", got.Len(), len(pool.GPUs), want.Len())
	}
	for p, g := range pool.GPUs {
		if g.Pos != p || g.Device.Name != driver.DeviceName(g.Index) {
			t.Errorf("GPU at position %d: %+v", p, g)
		}
		dg := got.GPUs[p]
		wp, ok := want.Position(dg.Index)
		if !ok {
			t.Fatalf("decoded GPU index %d was not encoded", dg.Index)
		}
		wg := want.GPUs[wp]
		cc, err := normalizeVersion(wg.CUDAComputeCapability)
		if err != nil {
			t.Fatal(err)
		}
		dv, err := normalizeVersion(wg.DriverVersion)
		if err != nil {
			t.Fatal(err)
		}
		wantGPU := topology.GPU{
			Index: wg.Index, Minor: wg.Minor, UUID: wg.UUID, ProductName: wg.ProductName,
			Architecture: wg.Architecture, CUDAComputeCapability: cc, DriverVersion: dv,
			PCIBusID: strings.ToLower(wg.PCIBusID), PCIeRoot: wg.PCIeRoot, NUMANode: wg.NUMANode, MemoryBytes: wg.MemoryBytes,
		}
		if fmt.Sprintf("%+v", dg) != fmt.Sprintf("%+v", wantGPU) {
			t.Errorf("GPU %d decoded as\n%+v\nwant\n%+v", dg.Index, dg, wantGPU)
		}
		for q := range pool.GPUs {
			wq, _ := want.Position(got.GPUs[q].Index)
			if got.Link(p, q) != want.Link(wp, wq) {
				t.Errorf("link %d-%d decoded %v, encoded %v", dg.Index, got.GPUs[q].Index, got.Link(p, q), want.Link(wp, wq))
			}
		}
	}
}

func TestDecodePoolErrors(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	encoded, err := Encode(logger, testNode, loadTopology(t, "pcie-4.txt"), defaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() []*resourceapi.ResourceSlice {
		s := objects(testNode, 1, encoded)
		s[0] = s[0].DeepCopy()
		return s
	}
	for name, tc := range map[string]struct {
		mutate func([]*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice
		want   string
	}{
		"incomplete": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.Pool.ResourceSliceCount = 2
			return s
		}, `pool "node-a" generation 1 is incomplete: 1 of 2 slices published`},
		"not node-local": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.NodeName = nil
			return s
		}, `slice "node-a-gpu.gpulink.dev-0" has no spec.nodeName`},
		"two nodes": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			other := s[0].DeepCopy()
			other.Name = "other"
			other.Spec.NodeName = ptr.To("node-b")
			other.Spec.Devices = nil
			s[0].Spec.Pool.ResourceSliceCount = 2
			other.Spec.Pool.ResourceSliceCount = 2
			return append(s, other)
		}, `slices name nodes "node-a" and "node-b"`},
		"duplicate index": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.Devices = append(s[0].Spec.Devices, *s[0].Spec.Devices[1].DeepCopy())
			return s
		}, `devices "gpu-1" and "gpu-1" both have index 1`},
		"index attribute differs from the name": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.Devices[2].Attributes[driver.AttrIndex] = resourceapi.DeviceAttribute{IntValue: ptr.To[int64](7)}
			return s
		}, `device "gpu-2": attribute index=7 does not match the index in its name`},
		"bad device name": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.Devices[0].Name = "gpu-x"
			return s
		}, `gpu-x`},
		"MIG device of a GPU published whole": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.Devices = append(s[0].Spec.Devices, resourceapi.Device{
				Name: driver.MIGDeviceName(1, 1, 0),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					driver.AttrParentIndex: {IntValue: ptr.To[int64](1)}, driver.AttrMIGProfile: {StringValue: ptr.To("1g.5gb")},
					driver.AttrPlacementStart: {IntValue: ptr.To[int64](0)}, driver.AttrPlacementSize: {IntValue: ptr.To[int64](1)},
				},
			})
			return s
		}, `is a MIG device of GPU 1, which is also published whole as "gpu-1"`},
		"MIG device without a profile": {func(s []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
			s[0].Spec.Devices = append(s[0].Spec.Devices, resourceapi.Device{
				Name:       driver.MIGDeviceName(9, 1, 0),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{driver.AttrParentIndex: {IntValue: ptr.To[int64](9)}},
			})
			return s
		}, `attribute profile (string) is missing`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodePool(testNode, tc.mutate(fresh()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if name == "incomplete" && !IsIncomplete(err) {
				t.Errorf("IsIncomplete(%v) = false", err)
			}
		})
	}
}

func TestCheckPoolNode(t *testing.T) {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{
		Pool: resourceapi.ResourcePool{Name: "node-b"}, NodeName: ptr.To("node-a")}}
	err := CheckPoolNode(s)
	if err == nil || !strings.Contains(err.Error(), `ResourceSlice "s" of node "node-a" names pool "node-b"`) {
		t.Errorf("CheckPoolNode: %v", err)
	}
	s.Spec.Pool.Name = "node-a"
	if err := CheckPoolNode(s); err != nil {
		t.Errorf("CheckPoolNode of a pool named after its node: %v", err)
	}
}

func TestWholeGPUMemory(t *testing.T) {
	topo, err := discovery.MockTopology("dgxa100", discovery.MockOptions{MIG: map[int][]string{0: {"1g.5gb"}}})
	if err != nil {
		t.Fatal(err)
	}
	logger, _ := ktesting.NewTestContext(t)
	encoded, err := Encode(logger, testNode, topo, defaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	sizes := WholeGPUMemory(objects(testNode, 1, encoded)[0])
	if len(sizes) != 7 {
		t.Fatalf("%d sizes (%v), want the 7 GPUs not in MIG mode", len(sizes), sizes)
	}
	for _, s := range sizes {
		if s != topo.GPUs[1].MemoryBytes {
			t.Errorf("size %d, want %d", s, topo.GPUs[1].MemoryBytes)
		}
	}
	foreign := objects(testNode, 1, encoded)[0]
	foreign.Spec.Driver = "nic.example.com"
	if got := WholeGPUMemory(foreign); got != nil {
		t.Errorf("another driver's slice: %v, want nil", got)
	}
}
