package sliceformat

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// encodePartitions publishes the GPUs partitioned on demand (MIG on
// demand, driver/mig/ondemand.go): per GPU one counter set named
// driver.MIGCounterSetName(index) holding its mig.Capacity, and one device
// per partition, named driver.PartitionDeviceName, that consumes from it
// one of each memory slice its placement covers, its compute slices, its
// memory and, for a profile the GPU allows fewer instances of than it has
// placements, one instance. So the API itself, and every allocator that
// honours counters (kube-scheduler's included), never gives out two
// partitions that overlap or that the GPU cannot hold together.
func encodePartitions(logger klog.Logger, t *topology.Topology, opts Options) ([]resourceapi.Device, []resourceapi.CounterSet, error) {
	var devices []resourceapi.Device
	var sets []resourceapi.CounterSet
	for _, g := range t.GPUs {
		if !g.MIGEnabled() || !g.MIG.OnDemand {
			continue
		}
		if len(g.MIG.Profiles) == 0 {
			return nil, nil, fmt.Errorf("GPU %d is partitioned on demand but NVML reported no MIG profile placements for it", g.Index)
		}
		c := g.MIG.Capacity()
		set, err := counterSet(g.Index, c)
		if err != nil {
			return nil, nil, fmt.Errorf("GPU %d: %w", g.Index, err)
		}
		sets = append(sets, set)
		for _, p := range g.MIG.Partitions() {
			dev, err := encodePartition(logger, g, c, p, opts)
			if err != nil {
				return nil, nil, fmt.Errorf("GPU %d: partition %s at memory slice %d: %w", g.Index, p.Profile.Name, p.Placement.Start, err)
			}
			devices = append(devices, dev)
		}
	}
	return devices, sets, nil
}

// counterSet is the counter set of a GPU partitioned on demand.
func counterSet(index int, c mig.Capacity) (resourceapi.CounterSet, error) {
	if c.MemorySlices <= 0 || c.ComputeSlices <= 0 || c.MemoryBytes <= 0 {
		return resourceapi.CounterSet{}, fmt.Errorf("MIG capacity %+v: memory slices, compute slices and memory must be known", c)
	}
	counters := map[string]resourceapi.Counter{
		driver.CounterComputeSlices: {Value: *resource.NewQuantity(int64(c.ComputeSlices), resource.DecimalSI)},
		driver.CounterMemory:        {Value: *resource.NewQuantity(c.MemoryBytes, resource.BinarySI)},
	}
	for k := range c.MemorySlices {
		counters[driver.MemorySliceCounter(k)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	for id, n := range c.MaxInstances {
		counters[driver.ProfileInstancesCounter(id)] = resourceapi.Counter{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
	}
	if len(counters) > maxCountersPerSet {
		return resourceapi.CounterSet{}, fmt.Errorf("counter set %s: %d counters (%d memory slices), at most %d allowed", driver.MIGCounterSetName(index), len(counters), c.MemorySlices, maxCountersPerSet)
	}
	return resourceapi.CounterSet{Name: driver.MIGCounterSetName(index), Counters: counters}, nil
}

// encodePartition is one partition's device: the parent's identity
// without its UUID (the instance and its UUID exist only once a claim that
// got the partition is prepared), the parent's UUID and index, and the
// profile's and placement's attributes as a MIG device has them, but no
// GPU or compute instance ID. Like a MIG device it is given out whole.
func encodePartition(logger klog.Logger, g topology.GPU, c mig.Capacity, p mig.Partition, opts Options) (resourceapi.Device, error) {
	if p.Profile.MemoryBytes <= 0 {
		return resourceapi.Device{}, fmt.Errorf("capacity %s: profile memory %d bytes is unknown", driver.CapacityMemory, p.Profile.MemoryBytes)
	}
	name, err := driver.PartitionDeviceName(g.Index, p.Profile.Name, p.Placement.Start)
	if err != nil {
		return resourceapi.Device{}, err
	}
	attrs, err := identityAttributes(logger, g, opts)
	if err != nil {
		return resourceapi.Device{}, err
	}
	delete(attrs, driver.AttrUUID)
	if g.UUID != "" {
		attrs[driver.AttrParentUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.UUID)}
	}
	setMIGAttributes(attrs, g.Index, p.Profile, p.Placement)
	consumes := map[string]resourceapi.Counter{
		driver.CounterComputeSlices: {Value: *resource.NewQuantity(int64(p.Profile.GISlices), resource.DecimalSI)},
		driver.CounterMemory:        {Value: *resource.NewQuantity(p.Profile.MemoryBytes, resource.BinarySI)},
	}
	for k := p.Placement.Start; k < p.Placement.End(); k++ {
		consumes[driver.MemorySliceCounter(k)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	if _, limited := c.MaxInstances[p.Profile.GIProfileID]; limited {
		consumes[driver.ProfileInstancesCounter(p.Profile.GIProfileID)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	dev := resourceapi.Device{
		Name:       name,
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			driver.CapacityMemory: {Value: *resource.NewQuantity(p.Profile.MemoryBytes, resource.BinarySI)},
		},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
			CounterSet: driver.MIGCounterSetName(g.Index),
			Counters:   consumes,
		}},
	}
	dev.Taints = managedTaints(opts)
	return dev, nil
}
