package controller

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
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
}

// buildMIGDevice reads a MIG device of a slice. Its name carries the
// parent's index, which the parentIndex attribute must repeat.
func buildMIGDevice(dev *resourceapi.Device) (*migDevice, error) {
	parent, _, _, err := driver.ParseMIGDeviceName(dev.Name)
	if err != nil {
		return nil, err
	}
	m := &migDevice{
		Name:   dev.Name,
		Parent: parent,
		Taints: dev.Taints,
		CEL: dracel.Device{
			Driver:                   driver.Name,
			AllowMultipleAllocations: dev.AllowMultipleAllocations,
			Attributes:               dev.Attributes,
			Capacity:                 dev.Capacity,
		},
	}
	intAttr := func(name string) (int, bool) {
		a, ok := dev.Attributes[resourceapi.QualifiedName(name)]
		if !ok || a.IntValue == nil {
			return 0, false
		}
		return int(*a.IntValue), true
	}
	if p, ok := intAttr(driver.AttrParentIndex); !ok || p != parent {
		return nil, fmt.Errorf("device %q: attribute %s must be the int %d of its name", dev.Name, driver.AttrParentIndex, parent)
	}
	if a, ok := dev.Attributes[driver.AttrMIGProfile]; ok && a.StringValue != nil {
		m.Profile = *a.StringValue
	} else {
		return nil, fmt.Errorf("device %q: attribute %s (string) is missing", dev.Name, driver.AttrMIGProfile)
	}
	start, okStart := intAttr(driver.AttrPlacementStart)
	size, okSize := intAttr(driver.AttrPlacementSize)
	if !okStart || !okSize || start < 0 || size <= 0 {
		return nil, fmt.Errorf("device %q: attributes %s and %s must be ints, start >= 0 and size > 0", dev.Name, driver.AttrPlacementStart, driver.AttrPlacementSize)
	}
	m.Placement = mig.Placement{Start: start, Size: size}
	if c, ok := dev.Capacity[driver.CapacityMemory]; ok {
		m.MemoryBytes = c.Value.Value()
	}
	if dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations {
		return nil, fmt.Errorf("device %q: a MIG device must not allow multiple allocations", dev.Name)
	}
	return m, nil
}
