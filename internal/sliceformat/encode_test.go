package sliceformat

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

func defaultOptions() Options {
	return Options{ManagedByController: true, DefaultShareMemory: resource.MustParse("4Gi"), DefaultShareCores: 25}
}

func buildOne(t *testing.T, topo *topology.Topology, opts Options) []resourceapi.Device {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	slices, err := Encode(logger, testNode, topo, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(slices) != 1 {
		t.Fatalf("%d slices, want 1", len(slices))
	}
	return slices[0]
}

func attr(t *testing.T, d resourceapi.Device, name string) resourceapi.DeviceAttribute {
	t.Helper()
	a, ok := d.Attributes[resourceapi.QualifiedName(name)]
	if !ok {
		t.Fatalf("device %s has no attribute %s", d.Name, name)
	}
	return a
}

func TestEncodeAttributes(t *testing.T) {
	topo := loadTopology(t, "v100-sxm2-8-aliyun-sccgn6.txt")
	devs := buildOne(t, topo, defaultOptions())
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	d0 := devs[0]
	if d0.Name != "gpu-0" {
		t.Errorf("name %q, want gpu-0", d0.Name)
	}
	wantInt := map[string]int64{driver.AttrIndex: 0, driver.AttrMinor: 0, driver.AttrNVLinkIsland: 0}
	for name, want := range wantInt {
		if got := attr(t, d0, name).IntValue; got == nil || *got != want {
			t.Errorf("%s = %v, want %d", name, got, want)
		}
	}
	wantString := map[string]string{
		driver.AttrUUID:         "GPU-00000000-0000-0000-0000-000000000000",
		driver.AttrProductName:  "Tesla V100-SXM2-16GB",
		driver.AttrArchitecture: "volta",
		driver.AttrPCIBusID:     "0000:10:00.0",
		driver.AttrPCIeRoot:     "pci0000:00",
		// From the fixture: GPU0 -> NV1 NV1 NV2 SYS SYS NV2 SYS.
		driver.AttrLinks: "X112SS2S",
	}
	for name, want := range wantString {
		if got := attr(t, d0, name).StringValue; got == nil || *got != want {
			t.Errorf("%s = %v, want %q", name, got, want)
		}
	}
	wantVersion := map[string]string{driver.AttrCUDAComputeCapability: "7.0.0", driver.AttrDriverVersion: "535.104.5"}
	for name, want := range wantVersion {
		if got := attr(t, d0, name).VersionValue; got == nil || *got != want {
			t.Errorf("%s = %v, want %q", name, got, want)
		}
	}
	for _, name := range []resourceapi.QualifiedName{resourceapi.QualifiedName(driver.AttrNUMANode), deviceattribute.StandardDeviceAttributeNUMANode} {
		if _, ok := d0.Attributes[name]; ok {
			t.Errorf("%s published although the topology file has no NUMA affinity", name)
		}
	}
	// The hybrid cube mesh is one NVLink island; groups of 2 and 4 exist
	// (8 itself is not published). Every GPU is in a group of each size
	// and GPUs of one group share its ID.
	for _, d := range devs {
		if got := *attr(t, d, driver.AttrNVLinkIsland).IntValue; got != 0 {
			t.Errorf("%s: nvlinkIsland %d, want 0", d.Name, got)
		}
		if _, ok := d.Attributes[resourceapi.QualifiedName(driver.GroupAttr(8))]; ok {
			t.Errorf("%s: group8 published for an 8-GPU node", d.Name)
		}
	}
	for _, k := range []int{2, 4} {
		members := map[int64]int{}
		for p, d := range devs {
			id := *attr(t, d, driver.GroupAttr(k)).IntValue
			members[id]++
			want, ok := topo.GroupOf(k, p)
			if !ok || int64(want) != id {
				t.Errorf("%s: group%d = %d, topology says %d (%v)", d.Name, k, id, want, ok)
			}
		}
		for id, n := range members {
			if n != k {
				t.Errorf("group%d %d has %d members, want %d", k, id, n, k)
			}
		}
	}
	// Every row decodes back to the fixture's matrix.
	rows := map[int]string{}
	gpus := make([]topology.GPU, 0, len(devs))
	for _, d := range devs {
		idx := int(*attr(t, d, driver.AttrIndex).IntValue)
		rows[idx] = *attr(t, d, driver.AttrLinks).StringValue
		gpus = append(gpus, topology.GPU{Index: idx, NUMANode: -1})
	}
	back, err := topology.DecodeLinkRows(gpus, rows)
	if err != nil {
		t.Fatal(err)
	}
	for i := range topo.Len() {
		for j := range topo.Len() {
			if back.Link(i, j) != topo.Link(i, j) {
				t.Errorf("link %d-%d decodes to %s, want %s", i, j, back.Link(i, j), topo.Link(i, j))
			}
		}
	}
}

func TestEncodeCapacityAndTaints(t *testing.T) {
	topo := loadTopology(t, "pcie-4.txt")
	devs := buildOne(t, topo, defaultOptions())
	d := devs[2]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Errorf("allowMultipleAllocations not set")
	}
	if got := *attr(t, d, driver.AttrNUMANode).IntValue; got != 1 {
		t.Errorf("numaNode %d, want 1", got)
	}
	// The standard attribute as well, so claims can matchAttribute it with
	// other drivers' devices (scalar form: works without feature gates).
	if a, ok := d.Attributes[deviceattribute.StandardDeviceAttributeNUMANode]; !ok || a.IntValue == nil || *a.IntValue != 1 {
		t.Errorf("%s = %+v, want 1", deviceattribute.StandardDeviceAttributeNUMANode, a)
	}
	mem := d.Capacity[driver.CapacityMemory]
	if mem.Value.Value() != 16*gib {
		t.Errorf("memory %s, want 16Gi", mem.Value.String())
	}
	p := mem.RequestPolicy
	if p == nil || p.ValidRange == nil {
		t.Fatalf("memory request policy %+v", p)
	}
	for name, tc := range map[string]struct {
		got  *resource.Quantity
		want int64
	}{
		"default": {p.Default, 4 * gib},
		"min":     {p.ValidRange.Min, 1 << 20},
		"max":     {p.ValidRange.Max, 16 * gib},
		"step":    {p.ValidRange.Step, 1 << 20},
	} {
		if tc.got == nil || tc.got.Value() != tc.want {
			t.Errorf("memory %s = %v, want %d", name, tc.got, tc.want)
		}
	}
	cores := d.Capacity[driver.CapacityCores]
	cp := cores.RequestPolicy
	if cores.Value.Value() != 100 || cp == nil || cp.Default.Value() != 25 || cp.ValidRange.Min.Value() != 1 ||
		cp.ValidRange.Max.Value() != 100 || cp.ValidRange.Step.Value() != 1 {
		t.Errorf("cores capacity %+v policy %+v", cores.Value, cp)
	}
	want := resourceapi.DeviceTaint{Key: driver.ManagedTaintKey, Value: "true", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	if len(d.Taints) != 1 || d.Taints[0] != want {
		t.Errorf("taints %+v, want [%+v]", d.Taints, want)
	}

	// Without the controller: no taints. A default share larger than the
	// GPU is clamped to it.
	opts := defaultOptions()
	opts.ManagedByController = false
	opts.DefaultShareMemory = resource.MustParse("64Gi")
	opts.DefaultShareCores = 500
	d = buildOne(t, topo, opts)[0]
	if len(d.Taints) != 0 {
		t.Errorf("taints %+v without --managed-by-controller", d.Taints)
	}
	if got := d.Capacity[driver.CapacityMemory].RequestPolicy.Default.Value(); got != 16*gib {
		t.Errorf("clamped memory default %d, want %d", got, 16*gib)
	}
	if got := d.Capacity[driver.CapacityCores].RequestPolicy.Default.Value(); got != 100 {
		t.Errorf("clamped cores default %d, want 100", got)
	}
}

func TestEncodeErrors(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	for name, tc := range map[string]struct {
		mutate func(t *topology.Topology) *topology.Topology
		want   string
	}{
		"GPU index beyond the links attribute": {
			mutate: func(t *topology.Topology) *topology.Topology {
				gpus := append([]topology.GPU(nil), t.GPUs...)
				gpus[3].Index = 70
				gpus[3].Minor = 70
				links := make([][]topology.Link, t.Len())
				for i := range links {
					links[i] = make([]topology.Link, t.Len())
					for j := range links[i] {
						links[i][j] = t.Link(i, j)
					}
				}
				nt, err := topology.New(gpus, links)
				if err != nil {
					panic(err)
				}
				return nt
			},
			want: "GPU index 70",
		},
		"product name too long": {
			mutate: func(t *topology.Topology) *topology.Topology {
				t.GPUs[1].ProductName = strings.Repeat("x", 65)
				return t
			},
			want: "attribute productName: value",
		},
		"unknown memory": {
			mutate: func(t *topology.Topology) *topology.Topology {
				t.GPUs[0].MemoryBytes = 0
				return t
			},
			want: "capacity memory",
		},
		"bad driver version": {
			mutate: func(t *topology.Topology) *topology.Topology {
				t.GPUs[0].DriverVersion = "r535 beta"
				return t
			},
			want: `attribute driverVersion: version "r535 beta"`,
		},
		"bad PCI bus ID": {
			mutate: func(t *topology.Topology) *topology.Topology {
				t.GPUs[0].PCIBusID = "07:00.0"
				return t
			},
			want: "attribute resource.kubernetes.io/pciBusID",
		},
	} {
		t.Run(name, func(t *testing.T) {
			topo := tc.mutate(loadTopology(t, "pcie-4.txt"))
			_, err := Encode(logger, testNode, topo, defaultOptions())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), testNode) {
				t.Errorf("error %q does not name the node", err)
			}
		})
	}
}

func TestValidateSliceLimits(t *testing.T) {
	dev := func(name string, nattrs int, tainted bool) resourceapi.Device {
		d := resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
		for i := range nattrs {
			d.Attributes[resourceapi.QualifiedName("a"+strings.Repeat("b", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26)))] = intAttr(1)
		}
		if tainted {
			d.Taints = []resourceapi.DeviceTaint{{Key: driver.ManagedTaintKey, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		return d
	}
	many := func(n int, tainted bool) []resourceapi.Device {
		out := make([]resourceapi.Device, n)
		for i := range out {
			out[i] = dev(driver.DeviceName(i), 1, tainted)
		}
		return out
	}
	for name, tc := range map[string]struct {
		slice    []resourceapi.Device
		perSlice int
		want     string
	}{
		"33 attributes":       {[]resourceapi.Device{dev("gpu-0", 33, false)}, 128, "33 attributes and capacities, at most 32"},
		"129 devices":         {many(129, false), 128, "129 devices, at most 128"},
		"65 tainted devices":  {many(65, true), 128, "65 devices with taints or counters, at most 64"},
		"long attribute name": {[]resourceapi.Device{{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{resourceapi.QualifiedName(strings.Repeat("n", 33)): intAttr(1)}}}, 128, "C identifier of at most 32"},
		"ok: 64 tainted":      {many(64, true), 64, ""},
		"ok: 32 attributes":   {[]resourceapi.Device{dev("gpu-0", 32, false)}, 128, ""},
	} {
		t.Run(name, func(t *testing.T) {
			err := validateSlice(tc.slice, tc.perSlice)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNormalizeVersion(t *testing.T) {
	for in, want := range map[string]string{
		"8.0":            "8.0.0",
		"9":              "9.0.0",
		"550.54.15":      "550.54.15",
		"535.104.05":     "535.104.5",
		"12.4.0-rc.1":    "12.4.0-rc.1",
		"1.2.3+build.7":  "1.2.3+build.7",
		"":               "",
		"8.0.1.2":        "",
		"v550":           "",
		"550.54.15-01.x": "",
	} {
		got, err := normalizeVersion(in)
		if want == "" {
			if err == nil {
				t.Errorf("normalizeVersion(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("normalizeVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
