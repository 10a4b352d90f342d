package sliceformat

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
)

// OnDemandGPU is a GPU partitioned on demand (MIG on demand) as its pool
// publishes it: its counter set and the partitions that consume from it.
// A set of its partitions can be allocated together exactly when Fits
// says so, which is the rule the API's counters enforce.
type OnDemandGPU struct {
	// Index is the GPU's index (the counter set is gpu-<index>-mig).
	Index int
	// CounterSet is the name of the GPU's counter set.
	CounterSet string
	// Counters is the counter set as published: each counter's value by
	// name (memory-slice-<k> 1 each, compute-slices, memory in bytes,
	// profile-<id>-instances).
	Counters map[string]int64
	// Capacity is Counters read as the GPU's MIG capacity.
	Capacity mig.Capacity
	// Partitions are the GPU's partitions in slice order.
	Partitions []Partition
}

// Partition is one partition of a GPU partitioned on demand: a GPU
// instance of Profile at Placement, created when a claim that got it is
// prepared. It is given out whole, one claim at a time.
type Partition struct {
	// Device is the published device; read it, never modify it.
	Device *resourceapi.Device
	// Parent is the index of the GPU.
	Parent int
	// Profile is the MIG profile's nvidia-smi name, e.g. "1g.5gb".
	Profile   string
	Placement mig.Placement
	// MemoryBytes is the partition's memory (capacity memory).
	MemoryBytes int64
	// Multiprocessors are its SMs (attribute multiprocessors).
	Multiprocessors int
	// Consumes is what allocating the partition takes from its GPU's
	// counter set, by counter name: memory-slice-<k> for each memory
	// slice of its placement, compute-slices, memory, and
	// profile-<id>-instances for a profile the GPU limits.
	Consumes map[string]int64
}

// Fits reports whether the partitions (of this GPU) can be allocated
// together: what they consume of each counter adds up to no more than the
// counter set has, so no two overlap and the GPU holds them all.
func (g *OnDemandGPU) Fits(parts []*Partition) error {
	used := map[string]int64{}
	for _, p := range parts {
		if p.Parent != g.Index {
			return fmt.Errorf("partition %s is of GPU %d, not of GPU %d", p.Device.Name, p.Parent, g.Index)
		}
		for name, v := range p.Consumes {
			used[name] += v
		}
	}
	names := make([]string, 0, len(used))
	for name := range used {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if used[name] > g.Counters[name] {
			return fmt.Errorf("counter %s of counter set %s: the partitions consume %d, it has %d", name, g.CounterSet, used[name], g.Counters[name])
		}
	}
	return nil
}

// decodeOnDemand reads the pool's counter sets of GPUs partitioned on
// demand and their partitions. Counter sets not named like gpulink's are
// left alone (a later format may add others); a partition whose counter
// set is missing, or that consumes counters its set lacks, is an error,
// as the API would refuse to allocate it.
func decodeOnDemand(sets []*resourceapi.CounterSet, partitions []*resourceapi.Device) ([]OnDemandGPU, error) {
	byIndex := map[int]*OnDemandGPU{}
	var order []int
	for _, cs := range sets {
		rest, ok := strings.CutSuffix(cs.Name, "-mig")
		if !ok {
			continue
		}
		index, err := driver.ParseDeviceName(rest)
		if err != nil {
			continue
		}
		if _, dup := byIndex[index]; dup {
			return nil, fmt.Errorf("counter set %q is published twice", cs.Name)
		}
		g, err := decodeCounterSet(index, cs)
		if err != nil {
			return nil, err
		}
		byIndex[index] = g
		order = append(order, index)
	}
	names := map[string]bool{}
	for _, dev := range partitions {
		p, err := decodePartition(dev)
		if err != nil {
			return nil, err
		}
		if names[dev.Name] {
			return nil, fmt.Errorf("device %q is published twice", dev.Name)
		}
		names[dev.Name] = true
		g := byIndex[p.Parent]
		if g == nil {
			return nil, fmt.Errorf("device %q: its GPU's counter set %q is not in the pool", dev.Name, driver.MIGCounterSetName(p.Parent))
		}
		for name := range p.Consumes {
			if _, ok := g.Counters[name]; !ok {
				return nil, fmt.Errorf("device %q: consumes counter %s, which counter set %q lacks", dev.Name, name, g.CounterSet)
			}
		}
		g.Partitions = append(g.Partitions, p)
	}
	slices.Sort(order)
	out := make([]OnDemandGPU, 0, len(order))
	for _, i := range order {
		out = append(out, *byIndex[i])
	}
	return out, nil
}

// decodeCounterSet reads a GPU's counter set into its MIG capacity.
func decodeCounterSet(index int, cs *resourceapi.CounterSet) (*OnDemandGPU, error) {
	g := &OnDemandGPU{Index: index, CounterSet: cs.Name, Counters: make(map[string]int64, len(cs.Counters))}
	for name, c := range cs.Counters {
		v := c.Value.Value()
		g.Counters[name] = v
		switch {
		case name == driver.CounterComputeSlices:
			g.Capacity.ComputeSlices = int(v)
		case name == driver.CounterMemory:
			g.Capacity.MemoryBytes = v
		case strings.HasPrefix(name, "memory-slice-"):
			g.Capacity.MemorySlices++
		case strings.HasPrefix(name, "profile-") && strings.HasSuffix(name, "-instances"):
			id, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(name, "profile-"), "-instances"))
			if err != nil {
				return nil, fmt.Errorf("counter set %q: counter %q: want profile-<id>-instances", cs.Name, name)
			}
			if g.Capacity.MaxInstances == nil {
				g.Capacity.MaxInstances = map[int]int{}
			}
			g.Capacity.MaxInstances[id] = int(v)
		}
	}
	for k := range g.Capacity.MemorySlices {
		if g.Counters[driver.MemorySliceCounter(k)] != 1 {
			return nil, fmt.Errorf("counter set %q: counter %s must be 1 (memory slices are counted 0..%d, one each)", cs.Name, driver.MemorySliceCounter(k), g.Capacity.MemorySlices-1)
		}
	}
	if g.Capacity.MemorySlices == 0 || g.Capacity.ComputeSlices <= 0 || g.Capacity.MemoryBytes <= 0 {
		return nil, fmt.Errorf("counter set %q: counters %s, %s and memory-slice-<k> must be positive", cs.Name, driver.CounterComputeSlices, driver.CounterMemory)
	}
	return g, nil
}

// decodePartition reads a partition device. Its name carries the parent's
// index, profile and placement start, which its attributes must repeat.
func decodePartition(dev *resourceapi.Device) (Partition, error) {
	parent, err := driver.ParsePartitionParent(dev.Name)
	if err != nil {
		return Partition{}, err
	}
	intAttr := func(name string) (int, bool) {
		a, ok := Attribute(dev, name)
		if !ok || a.IntValue == nil {
			return 0, false
		}
		return int(*a.IntValue), true
	}
	p := Partition{Device: dev, Parent: parent}
	if i, ok := intAttr(driver.AttrParentIndex); !ok || i != parent {
		return Partition{}, fmt.Errorf("device %q: attribute %s must be the int %d of its name", dev.Name, driver.AttrParentIndex, parent)
	}
	if a, ok := Attribute(dev, driver.AttrMIGProfile); ok && a.StringValue != nil {
		p.Profile = *a.StringValue
	} else {
		return Partition{}, fmt.Errorf("device %q: attribute %s (string) is missing", dev.Name, driver.AttrMIGProfile)
	}
	start, okStart := intAttr(driver.AttrPlacementStart)
	size, okSize := intAttr(driver.AttrPlacementSize)
	if !okStart || !okSize || start < 0 || size <= 0 {
		return Partition{}, fmt.Errorf("device %q: attributes %s and %s must be ints, start >= 0 and size > 0", dev.Name, driver.AttrPlacementStart, driver.AttrPlacementSize)
	}
	p.Placement = mig.Placement{Start: start, Size: size}
	if want, err := driver.PartitionDeviceName(parent, p.Profile, start); err != nil || want != dev.Name {
		return Partition{}, fmt.Errorf("device %q: its attributes (profile %s at memory slice %d) name another partition (%q, %v)", dev.Name, p.Profile, start, want, err)
	}
	p.Multiprocessors, _ = intAttr(driver.AttrMultiprocessors)
	if c, ok := Capacity(dev, driver.CapacityMemory); ok {
		p.MemoryBytes = c.Value.Value()
	}
	if dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations {
		return Partition{}, fmt.Errorf("device %q: a partition must not allow multiple allocations", dev.Name)
	}
	if len(dev.ConsumesCounters) != 1 || dev.ConsumesCounters[0].CounterSet != driver.MIGCounterSetName(parent) {
		return Partition{}, fmt.Errorf("device %q: must consume counters of counter set %q only", dev.Name, driver.MIGCounterSetName(parent))
	}
	p.Consumes = make(map[string]int64, len(dev.ConsumesCounters[0].Counters))
	for name, c := range dev.ConsumesCounters[0].Counters {
		p.Consumes[name] = c.Value.Value()
	}
	for k := p.Placement.Start; k < p.Placement.End(); k++ {
		if p.Consumes[driver.MemorySliceCounter(k)] != 1 {
			return Partition{}, fmt.Errorf("device %q: placement %d+%d must consume 1 of counter %s", dev.Name, start, size, driver.MemorySliceCounter(k))
		}
	}
	return p, nil
}
