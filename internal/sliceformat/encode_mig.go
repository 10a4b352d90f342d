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

// wholeGPUs is the node as far as whole GPUs and shares go: the GPUs not
// in MIG mode, with islands, groups and link rows of their own, so that no
// set or group ever counts on a GPU that is only given out in MIG devices.
func wholeGPUs(t *topology.Topology) (*topology.Topology, error) {
	keep := make([]int, 0, t.Len())
	for p, g := range t.GPUs {
		if !g.MIGEnabled() {
			keep = append(keep, p)
		}
	}
	if len(keep) == t.Len() {
		return t, nil
	}
	return t.Subset(keep)
}

// buildMIGDevices publishes the existing MIG devices of the node's GPUs in
// MIG mode: one device per compute instance, named
// driver.MIGDeviceName(parent index, GI, CI), exclusive (no
// allowMultipleAllocations), with the parent's identity attributes and
// the instance's own (placement, profile, engines; driver/names.go).
func encodeMIGDevices(logger klog.Logger, t *topology.Topology, opts Options) ([]resourceapi.Device, error) {
	var out []resourceapi.Device
	for _, g := range t.GPUs {
		if !g.MIGEnabled() || g.MIG.OnDemand {
			// A GPU partitioned on demand is published as its
			// partitions; its instances are the claims' (encode_ondemand.go).
			continue
		}
		for _, in := range g.MIG.Instances {
			dev, err := encodeMIGDevice(logger, g, in, opts)
			if err != nil {
				return nil, fmt.Errorf("MIG device %s (profile %s) of GPU %d: %w", driver.MIGDeviceName(g.Index, in.GI, in.CI), in.Profile.Name, g.Index, err)
			}
			out = append(out, dev)
		}
	}
	return out, nil
}

func encodeMIGDevice(logger klog.Logger, g topology.GPU, in mig.Instance, opts Options) (resourceapi.Device, error) {
	if in.Profile.MemoryBytes <= 0 {
		return resourceapi.Device{}, fmt.Errorf("capacity %s: profile memory %d bytes is unknown", driver.CapacityMemory, in.Profile.MemoryBytes)
	}
	attrs, err := identityAttributes(logger, g, opts)
	if err != nil {
		return resourceapi.Device{}, err
	}
	// The device's own UUID replaces the parent's: NVIDIA_VISIBLE_DEVICES
	// and nvidia-smi name a MIG device by it.
	delete(attrs, driver.AttrUUID)
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(v)} }
	if in.UUID != "" {
		attrs[driver.AttrUUID] = str(in.UUID)
	}
	if g.UUID != "" {
		attrs[driver.AttrParentUUID] = str(g.UUID)
	}
	setMIGAttributes(attrs, g.Index, in.Profile, in.Placement)
	attrs[driver.AttrGPUInstance] = intAttr(int64(in.GI))
	attrs[driver.AttrComputeInstance] = intAttr(int64(in.CI))
	dev := resourceapi.Device{
		Name:       driver.MIGDeviceName(g.Index, in.GI, in.CI),
		Attributes: attrs,
		// A MIG device is given out whole: memory is what it has, for
		// selectors such as "at least 10Gi", not a consumable share.
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			driver.CapacityMemory: {Value: *resource.NewQuantity(in.Profile.MemoryBytes, resource.BinarySI)},
		},
	}
	dev.Taints = managedTaints(opts)
	return dev, nil
}

// setMIGAttributes sets what a MIG device and a partition both publish of
// themselves: type, profile, parent, placement and engines.
func setMIGAttributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, parent int, p mig.Profile, pl mig.Placement) {
	attrs[driver.AttrType] = resourceapi.DeviceAttribute{StringValue: ptr.To(driver.DeviceTypeMIG)}
	attrs[driver.AttrMIGProfile] = resourceapi.DeviceAttribute{StringValue: ptr.To(p.Name)}
	for name, v := range map[string]int{
		driver.AttrParentIndex:     parent,
		driver.AttrPlacementStart:  pl.Start,
		driver.AttrPlacementSize:   pl.Size,
		driver.AttrMultiprocessors: p.Multiprocessors,
		driver.AttrCopyEngines:     p.CopyEngines,
		driver.AttrDecoders:        p.Decoders,
		driver.AttrEncoders:        p.Encoders,
		driver.AttrJPEGEngines:     p.JPEGs,
		driver.AttrOFAEngines:      p.OFAs,
	} {
		attrs[resourceapi.QualifiedName(name)] = intAttr(int64(v))
	}
}
