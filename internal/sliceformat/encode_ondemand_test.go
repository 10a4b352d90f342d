package sliceformat

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// onDemandTopology is a simulated DGX (server) with the MIG layout, the
// GPUs of onDemand partitioned on demand.
func onDemandTopology(t *testing.T, server string, layout map[int][]string, onDemand ...int) *topology.Topology {
	t.Helper()
	topo, err := discovery.MockTopology(server, discovery.MockOptions{MIG: layout})
	if err != nil {
		t.Fatalf("MockTopology: %v", err)
	}
	for _, i := range onDemand {
		topo.GPUs[i].MIG.OnDemand = true
	}
	return topo
}

// sliceObjects wraps encoded slices into the ResourceSlice objects of one
// pool, as the resourceslice controller publishes them.
func sliceObjects(node string, generation int64, encoded []Slice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(encoded))
	for i, s := range encoded {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, driver.Name, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         driver.Name,
				Pool:           resourceapi.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: int64(len(encoded))},
				NodeName:       ptr.To(node),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		}
	}
	return out
}

func encodeSlices(t *testing.T, topo *topology.Topology, opts Options) []Slice {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	encoded, err := EncodeSlices(logger, testNode, topo, opts)
	if err != nil {
		t.Fatalf("EncodeSlices: %v", err)
	}
	return encoded
}

func TestEncodeOnDemand(t *testing.T) {
	// GPU 0 on demand (its instance is a claim's and not published), GPU 1
	// in MIG mode with a static instance, GPUs 2-7 whole.
	topo := onDemandTopology(t, "dgxa100", map[int][]string{0: {"3g.20gb"}, 1: {"7g.40gb"}}, 0)
	encoded := encodeSlices(t, topo, Options{ManagedByController: true})
	var devices []resourceapi.Device
	var sets []resourceapi.CounterSet
	for i, s := range encoded {
		if len(s.Devices) > 0 && len(s.SharedCounters) > 0 {
			t.Errorf("slice %d has both devices and counter sets", i)
		}
		if len(s.Devices) > 64 {
			t.Errorf("slice %d has %d devices, the API allows 64 with counters", i, len(s.Devices))
		}
		devices = append(devices, s.Devices...)
		sets = append(sets, s.SharedCounters...)
	}
	byName := map[string]resourceapi.Device{}
	for _, d := range devices {
		if _, dup := byName[d.Name]; dup {
			t.Errorf("device %s published twice", d.Name)
		}
		byName[d.Name] = d
	}
	for _, name := range []string{"gpu-0", "gpu-1", "gpu-0-mig-0-0"} {
		if _, ok := byName[name]; ok {
			t.Errorf("%s is published; a GPU on demand is published only as its partitions, one in MIG mode never whole", name)
		}
	}
	if _, ok := byName["gpu-1-mig-0-0"]; !ok {
		t.Error("the static MIG device gpu-1-mig-0-0 is missing")
	}
	// 7 + 3 + 2 + 1 + 1 + 7 + 4 partitions of the A100's profiles.
	parts := 0
	for name := range byName {
		if driver.IsPartitionDeviceName(name) {
			parts++
		}
	}
	if parts != 25 || len(devices) != 6+1+25 {
		t.Errorf("%d partitions and %d devices, want 25 and 32", parts, len(devices))
	}
	if len(sets) != 1 || sets[0].Name != "gpu-0-mig" {
		t.Fatalf("counter sets %v, want gpu-0-mig", sets)
	}
	wantCounters := map[string]int64{driver.CounterComputeSlices: 7, driver.CounterMemory: 40192 << 20, "profile-7-instances": 1}
	for k := range 8 {
		wantCounters[driver.MemorySliceCounter(k)] = 1
	}
	if len(sets[0].Counters) != len(wantCounters) {
		t.Errorf("counters %v, want %v", sets[0].Counters, wantCounters)
	}
	for name, v := range wantCounters {
		if got := sets[0].Counters[name].Value; got.Value() != v {
			t.Errorf("counter %s = %s, want %d", name, got.String(), v)
		}
	}
	for _, c := range []struct {
		name     string
		profile  string
		start    int64
		size     int64
		sms      int64
		consumes map[string]int64
	}{
		{"gpu-0-part-3g-20gb-at-4", "3g.20gb", 4, 4, 42, map[string]int64{
			"memory-slice-4": 1, "memory-slice-5": 1, "memory-slice-6": 1, "memory-slice-7": 1, driver.CounterComputeSlices: 3, driver.CounterMemory: 19968 << 20}},
		{"gpu-0-part-1g-5gb-with-me-at-2", "1g.5gb+me", 2, 1, 14, map[string]int64{
			"memory-slice-2": 1, driver.CounterComputeSlices: 1, driver.CounterMemory: 4864 << 20, "profile-7-instances": 1}},
		{"gpu-0-part-7g-40gb-at-0", "7g.40gb", 0, 8, 98, map[string]int64{
			"memory-slice-0": 1, "memory-slice-1": 1, "memory-slice-2": 1, "memory-slice-3": 1, "memory-slice-4": 1, "memory-slice-5": 1, "memory-slice-6": 1, "memory-slice-7": 1,
			driver.CounterComputeSlices: 7, driver.CounterMemory: 40192 << 20}},
	} {
		d, ok := byName[c.name]
		if !ok {
			t.Errorf("partition %s missing", c.name)
			continue
		}
		if got := *attr(t, d, driver.AttrMIGProfile).StringValue; got != c.profile {
			t.Errorf("%s: profile %q, want %q", c.name, got, c.profile)
		}
		if got := *attr(t, d, driver.AttrType).StringValue; got != driver.DeviceTypeMIG {
			t.Errorf("%s: type %q, want %q (the mig.gpulink.dev class selects it)", c.name, got, driver.DeviceTypeMIG)
		}
		if got := *attr(t, d, driver.AttrParentUUID).StringValue; got != topo.GPUs[0].UUID {
			t.Errorf("%s: parent UUID %q, want %q", c.name, got, topo.GPUs[0].UUID)
		}
		for name, want := range map[string]int64{driver.AttrParentIndex: 0, driver.AttrPlacementStart: c.start, driver.AttrPlacementSize: c.size, driver.AttrMultiprocessors: c.sms} {
			if got := *attr(t, d, name).IntValue; got != want {
				t.Errorf("%s: %s = %d, want %d", c.name, name, got, want)
			}
		}
		for _, absent := range []string{driver.AttrUUID, driver.AttrGPUInstance, driver.AttrComputeInstance} {
			if _, ok := d.Attributes[resourceapi.QualifiedName(absent)]; ok {
				t.Errorf("%s: has attribute %s, which only an existing instance has", c.name, absent)
			}
		}
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			t.Errorf("%s: allows multiple allocations", c.name)
		}
		if len(d.Taints) != 1 || d.Taints[0].Key != driver.ManagedTaintKey {
			t.Errorf("%s: taints %v, want the managed taint", c.name, d.Taints)
		}
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != "gpu-0-mig" || len(d.ConsumesCounters[0].Counters) != len(c.consumes) {
			t.Fatalf("%s: consumes %v, want %v of gpu-0-mig", c.name, d.ConsumesCounters, c.consumes)
		}
		for name, want := range c.consumes {
			if got := d.ConsumesCounters[0].Counters[name].Value; got.Value() != want {
				t.Errorf("%s: consumes %s %s, want %d", c.name, name, got.String(), want)
			}
		}
	}
	// Encode, whose callers know no counter sets, refuses such a node.
	logger, _ := ktesting.NewTestContext(t)
	if _, err := Encode(logger, testNode, topo, Options{}); err == nil || !strings.Contains(err.Error(), "use EncodeSlices") {
		t.Errorf("Encode of a node with a GPU on demand: %v, want an error naming EncodeSlices", err)
	}
}

// TestEncodeOnDemandWholeNode: eight H100s on demand take more than one
// slice of devices and one slice of eight counter sets.
func TestEncodeOnDemandWholeNode(t *testing.T) {
	layout := map[int][]string{}
	all := make([]int, 8)
	for i := range 8 {
		layout[i], all[i] = nil, i
	}
	topo := onDemandTopology(t, "dgxh100", layout, all...)
	encoded := encodeSlices(t, topo, Options{})
	devices, sets := 0, 0
	for _, s := range encoded {
		devices += len(s.Devices)
		sets += len(s.SharedCounters)
	}
	// 7 + 3 + 2 + 1 + 1 + 7 + 7 partitions per H100.
	if devices != 8*28 || sets != 8 || len(encoded) != 5 {
		t.Errorf("%d devices, %d counter sets in %d slices; want %d, 8 in 5", devices, sets, len(encoded), 8*28)
	}
	pool, err := DecodePool(testNode, sliceObjects(testNode, 1, encoded))
	if err != nil {
		t.Fatalf("DecodePool: %v", err)
	}
	if pool.Topology.Len() != 0 || len(pool.GPUs) != 0 || len(pool.MIG) != 0 || len(pool.OnDemand) != 8 {
		t.Errorf("decoded %d whole GPUs, %d MIG devices, %d GPUs on demand; want 0, 0, 8", pool.Topology.Len(), len(pool.MIG), len(pool.OnDemand))
	}
}

func TestRoundTripOnDemand(t *testing.T) {
	topo := onDemandTopology(t, "dgxa100", map[int][]string{0: {}, 1: {"7g.40gb"}, 3: {}}, 0, 3)
	pool, err := DecodePool(testNode, sliceObjects(testNode, 2, encodeSlices(t, topo, Options{})))
	if err != nil {
		t.Fatalf("DecodePool: %v", err)
	}
	// What the controller reads today is unchanged: the whole GPUs and
	// the static MIG devices.
	if pool.Topology.Len() != 5 || len(pool.MIG) != 1 || pool.MIG[0].Device.Name != "gpu-1-mig-0-0" {
		t.Errorf("decoded %d whole GPUs and MIG devices %v; want 5 and gpu-1-mig-0-0", pool.Topology.Len(), pool.MIG)
	}
	wholeGPUs := 0
	for _, s := range sliceObjects(testNode, 2, encodeSlices(t, topo, Options{})) {
		wholeGPUs += len(WholeGPUMemory(s))
	}
	if wholeGPUs != 5 {
		t.Errorf("WholeGPUMemory finds %d GPUs, want the 5 whole ones (no partition)", wholeGPUs)
	}
	if len(pool.OnDemand) != 2 || pool.OnDemand[0].Index != 0 || pool.OnDemand[1].Index != 3 {
		t.Fatalf("GPUs on demand %+v, want 0 and 3", pool.OnDemand)
	}
	for _, g := range pool.OnDemand {
		want := topo.GPUs[g.Index].MIG
		if c := want.Capacity(); g.Capacity.MemorySlices != c.MemorySlices || g.Capacity.ComputeSlices != c.ComputeSlices || g.Capacity.MemoryBytes != c.MemoryBytes || len(g.Capacity.MaxInstances) != len(c.MaxInstances) {
			t.Errorf("GPU %d: capacity %+v, want %+v", g.Index, g.Capacity, c)
		}
		parts := want.Partitions()
		if len(g.Partitions) != len(parts) {
			t.Fatalf("GPU %d: %d partitions, want %d", g.Index, len(g.Partitions), len(parts))
		}
		for i, p := range g.Partitions {
			w := parts[i]
			if p.Parent != g.Index || p.Profile != w.Profile.Name || p.Placement != w.Placement || p.MemoryBytes != w.Profile.MemoryBytes || p.Multiprocessors != w.Profile.Multiprocessors {
				t.Errorf("GPU %d partition %d = %+v, want %+v", g.Index, i, p, w)
			}
		}
	}
}

// TestOnDemandCountersMatchFits: for every pair and triple of partitions of
// the mocks' A100 40GB and H100 80GB, the published counters allow them
// together exactly when mig.Capacity.Fits does: the API enforces the
// GPU's rule.
func TestOnDemandCountersMatchFits(t *testing.T) {
	for _, server := range []string{"dgxa100", "dgxh100"} {
		t.Run(server, func(t *testing.T) {
			topo := onDemandTopology(t, server, map[int][]string{0: {}}, 0)
			pool, err := DecodePool(testNode, sliceObjects(testNode, 1, encodeSlices(t, topo, Options{})))
			if err != nil {
				t.Fatalf("DecodePool: %v", err)
			}
			g := pool.OnDemand[0]
			want := topo.GPUs[0].MIG
			c := want.Capacity()
			parts := want.Partitions()
			n, conflicts := 0, 0
			check := func(idx ...int) {
				decoded := make([]*Partition, len(idx))
				model := make([]mig.Partition, len(idx))
				for k, i := range idx {
					decoded[k], model[k] = &g.Partitions[i], parts[i]
				}
				errCounters, errModel := g.Fits(decoded), c.Fits(model)
				if (errCounters == nil) != (errModel == nil) {
					t.Errorf("%v: counters say %v, the GPU's rule %v", model, errCounters, errModel)
				}
				n++
				if errModel != nil {
					conflicts++
				}
			}
			for i := range parts {
				for j := i + 1; j < len(parts); j++ {
					check(i, j)
					for k := j + 1; k < len(parts); k++ {
						check(i, j, k)
					}
				}
			}
			if conflicts == 0 || conflicts == n {
				t.Errorf("%d of %d sets conflict; want some of each", conflicts, n)
			}
		})
	}
}

func TestDecodeOnDemandErrors(t *testing.T) {
	topo := onDemandTopology(t, "dgxa100", map[int][]string{0: {}}, 0)
	for _, c := range []struct {
		name   string
		mutate func([]*resourceapi.ResourceSlice)
		want   string
	}{
		{"counter set missing", func(s []*resourceapi.ResourceSlice) {
			s[len(s)-1].Spec.SharedCounters = []resourceapi.CounterSet{{Name: "other", Counters: map[string]resourceapi.Counter{}}}
		}, `counter set "gpu-0-mig" is not in the pool`},
		{"name and attributes disagree", func(s []*resourceapi.ResourceSlice) {
			d := partitionDevice(s, "gpu-0-part-1g-5gb-at-3")
			d.Attributes[driver.AttrPlacementStart] = intAttr(4)
		}, `device "gpu-0-part-1g-5gb-at-3": its attributes (profile 1g.5gb at memory slice 4) name another partition`},
		{"counter the set lacks", func(s []*resourceapi.ResourceSlice) {
			d := partitionDevice(s, "gpu-0-part-1g-5gb-at-3")
			d.ConsumesCounters[0].Counters["decoders"] = resourceapi.Counter{}
		}, "consumes counter decoders, which counter set \"gpu-0-mig\" lacks"},
		{"published whole too", func(s []*resourceapi.ResourceSlice) {
			gpu0 := s[0].Spec.Devices[0].DeepCopy()
			gpu0.Name = "gpu-0"
			gpu0.Attributes[driver.AttrIndex] = intAttr(0)
			s[0].Spec.Devices = append(s[0].Spec.Devices, *gpu0)
		}, "GPU 0 is partitioned on demand (counter set \"gpu-0-mig\") and also published whole"},
	} {
		t.Run(c.name, func(t *testing.T) {
			slices := sliceObjects(testNode, 1, encodeSlices(t, topo, Options{}))
			c.mutate(slices)
			_, err := DecodePool(testNode, slices)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("DecodePool: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// partitionDevice finds a device in a pool's slices.
func partitionDevice(slices []*resourceapi.ResourceSlice, name string) *resourceapi.Device {
	for _, s := range slices {
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == name {
				return &s.Spec.Devices[i]
			}
		}
	}
	panic("no device " + name)
}
