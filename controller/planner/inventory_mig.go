package planner

import (
	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// migDevice is one MIG device as a node's slice publishes it. MIG devices
// are kept apart from the GPUs of nodeInventory.Devices: they have no link
// row, no place in the link matrix, and are never given out whole-GPU
// style or in shares, only each as one exclusive device.
type migDevice struct {
	Name string
	// Parent is the index of the GPU the device is part of.
	Parent    int
	Profile   string
	Placement mig.Placement
	// MemoryBytes is the device's memory capacity.
	MemoryBytes int64
	CEL         dracel.Device
	Taints      []resourceapi.DeviceTaint
	// scheduling are the Taints that keep work off the device
	// (sliceformat.SchedulingTaints), kept so that a decision reads no
	// taint of the hundreds of partitions a node may have when none has one.
	scheduling []resourceapi.DeviceTaint
	// OnDemand is set for a partition of a GPU partitioned on demand
	// (inventory_ondemand.go): its GPU, the GPU's position in
	// NodeInventory.OnDemand and the partition in the GPU's table. Nil
	// for a MIG device that exists.
	OnDemand *onDemandGPU
	ODPos    int
	Part     mig.Part
}

// newMIGDevice keeps what decisions read of a decoded MIG device.
func newMIGDevice(m sliceformat.MIGDevice) *migDevice {
	dev := m.Device
	return &migDevice{
		Name:        dev.Name,
		Parent:      m.Parent,
		Profile:     m.Profile,
		Placement:   m.Placement,
		MemoryBytes: m.MemoryBytes,
		Taints:      dev.Taints,
		scheduling:  sliceformat.SchedulingTaints(dev.Taints),
		CEL:         celDevice(dev),
	}
}
