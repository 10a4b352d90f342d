package sliceformat

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// Pool is one node's gpulink pool as its newest complete generation of
// ResourceSlices publishes it.
type Pool struct {
	Name       string
	Node       string
	Generation int64
	// Topology holds the whole GPUs (not those in MIG mode) and their
	// links, decoded from the links attributes.
	Topology *topology.Topology
	// GPUs is indexed by position in Topology.
	GPUs []GPU
	// MIG are the pool's MIG devices, in slice order.
	MIG []MIGDevice
	// OnDemand are the pool's GPUs partitioned on demand (MIG on demand,
	// decode_ondemand.go), by GPU index, each with its counters and its
	// partitions. They are neither in Topology/GPUs nor in MIG: readers
	// that do not place partitions see nothing of them.
	OnDemand []OnDemandGPU
}

// GPU is a whole GPU of a pool.
type GPU struct {
	// Device is the published device, shared with the slice it was read
	// from (copying the attribute maps of thousands of nodes would cost
	// most of a reader's memory): read it, never modify it.
	Device *resourceapi.Device
	// Index is the GPU's index, from the device name gpu-<index>.
	Index int
	// Pos is the GPU's position in Pool.Topology.
	Pos int
}

// MIGDevice is a MIG device of a pool. It has no place in the link
// topology: it is given out only whole, each as one exclusive device.
type MIGDevice struct {
	// Device is the published device; read it, never modify it.
	Device *resourceapi.Device
	// Parent is the index of the GPU the device is part of.
	Parent      int
	Profile     string
	Placement   mig.Placement
	MemoryBytes int64
}

// IncompletePoolError reports a pool whose newest generation has not
// published all its slices yet: a reader waits for the rest rather than
// see a node with GPUs missing.
type IncompletePoolError struct {
	Pool             string
	Generation       int64
	Have, ShouldHave int64
}

func (e *IncompletePoolError) Error() string {
	return fmt.Sprintf("pool %q generation %d is incomplete: %d of %d slices published", e.Pool, e.Generation, e.Have, e.ShouldHave)
}

// ForeignPoolError reports a node-local slice whose pool is named after
// another node.
type ForeignPoolError struct {
	Slice, Pool, Node string
}

func (e *ForeignPoolError) Error() string {
	return fmt.Sprintf("ResourceSlice %q of node %q names pool %q: a gpulink pool must be named after the node that publishes it (spec.pool.name == spec.nodeName), so the slice is ignored",
		e.Slice, e.Node, e.Pool)
}

// CheckPoolNode refuses a slice that names a node but puts its devices in
// a pool named otherwise. Pools are keyed by name and the newest
// generation wins, so without this check the kubelet plugin of one node
// (whose credentials only vouch for spec.nodeName) could publish pool
// "node-b" at a high generation and hide node-b's GPUs, or split a pool
// across nodes. The chart's ValidatingAdmissionPolicy enforces the same
// rule at the API server; readers check it too, to stay safe where the
// policy is not installed. Slices without spec.nodeName are left to
// DecodePool, which refuses them.
func CheckPoolNode(slice *resourceapi.ResourceSlice) error {
	if slice.Spec.NodeName == nil || *slice.Spec.NodeName == "" || *slice.Spec.NodeName == slice.Spec.Pool.Name {
		return nil
	}
	return &ForeignPoolError{Slice: slice.Name, Pool: slice.Spec.Pool.Name, Node: *slice.Spec.NodeName}
}

// DecodePool reads the slices of one pool (all of gpulink's driver): only
// the newest generation counts, and it must be complete and node-local.
// A GPU in MIG mode must not also be published whole.
func DecodePool(pool string, slices []*resourceapi.ResourceSlice) (*Pool, error) {
	if len(slices) == 0 {
		return nil, fmt.Errorf("pool %q has no slices", pool)
	}
	var gen int64
	for _, s := range slices {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var current []*resourceapi.ResourceSlice
	for _, s := range slices {
		if s.Spec.Pool.Generation == gen {
			current = append(current, s)
		}
	}
	sort.Slice(current, func(i, j int) bool { return current[i].Name < current[j].Name })
	if want := current[0].Spec.Pool.ResourceSliceCount; int64(len(current)) < want {
		return nil, &IncompletePoolError{Pool: pool, Generation: gen, Have: int64(len(current)), ShouldHave: want}
	}
	nodeName := ""
	var devices []*resourceapi.Device
	var counterSets []*resourceapi.CounterSet
	for _, s := range current {
		if s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
			return nil, fmt.Errorf("pool %q: slice %q has no spec.nodeName; gpulink pools are node-local", pool, s.Name)
		}
		if nodeName != "" && *s.Spec.NodeName != nodeName {
			return nil, fmt.Errorf("pool %q: slices name nodes %q and %q", pool, nodeName, *s.Spec.NodeName)
		}
		nodeName = *s.Spec.NodeName
		for i := range s.Spec.Devices {
			devices = append(devices, &s.Spec.Devices[i])
		}
		for i := range s.Spec.SharedCounters {
			counterSets = append(counterSets, &s.Spec.SharedCounters[i])
		}
	}
	var gpus []GPU
	seen := map[int]string{}
	var migs []MIGDevice
	var partitions []*resourceapi.Device
	for _, dev := range devices {
		if driver.IsPartitionDeviceName(dev.Name) {
			partitions = append(partitions, dev)
			continue
		}
		if driver.IsMIGDeviceName(dev.Name) {
			m, err := decodeMIGDevice(dev)
			if err != nil {
				return nil, fmt.Errorf("pool %q: %w", pool, err)
			}
			migs = append(migs, m)
			continue
		}
		g, err := decodeGPU(dev)
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pool, err)
		}
		if other, dup := seen[g.Index]; dup {
			return nil, fmt.Errorf("pool %q: devices %q and %q both have index %d", pool, other, dev.Name, g.Index)
		}
		seen[g.Index] = dev.Name
		gpus = append(gpus, g)
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	tgpus := make([]topology.GPU, len(gpus))
	rows := make(map[int]string, len(gpus))
	for i, g := range gpus {
		tgpus[i] = topologyGPU(g.Device, g.Index)
		if a, ok := Attribute(g.Device, driver.AttrLinks); ok && a.StringValue != nil {
			rows[g.Index] = *a.StringValue
		}
	}
	onDemand, err := decodeOnDemand(counterSets, partitions)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", pool, err)
	}
	migParents := map[int]string{}
	for _, m := range migs {
		migParents[m.Parent] = m.Device.Name
	}
	for _, g := range onDemand {
		if whole, ok := seen[g.Index]; ok {
			return nil, fmt.Errorf("pool %q: GPU %d is partitioned on demand (counter set %q) and also published whole as %q", pool, g.Index, g.CounterSet, whole)
		}
		if m, ok := migParents[g.Index]; ok {
			return nil, fmt.Errorf("pool %q: GPU %d is partitioned on demand (counter set %q) and also publishes its MIG device %q; its instances belong to the claims of its partitions", pool, g.Index, g.CounterSet, m)
		}
	}
	var topo *topology.Topology
	if len(gpus) == 0 && (len(migs) > 0 || len(onDemand) > 0) {
		// Every GPU of the node is in MIG mode: no whole GPU, no links.
		topo, err = topology.New(nil, nil)
	} else {
		topo, err = topology.DecodeLinkRows(tgpus, rows)
	}
	if err != nil {
		return nil, fmt.Errorf("pool %q: decoding link rows: %w", pool, err)
	}
	for _, m := range migs {
		if whole, ok := seen[m.Parent]; ok {
			return nil, fmt.Errorf("pool %q: device %q is a MIG device of GPU %d, which is also published whole as %q; a GPU in MIG mode is given out only as its MIG devices", pool, m.Device.Name, m.Parent, whole)
		}
	}
	out := &Pool{Name: pool, Node: nodeName, Generation: gen, Topology: topo, GPUs: make([]GPU, topo.Len()), MIG: migs, OnDemand: onDemand}
	filled := make([]bool, topo.Len())
	for _, g := range gpus {
		p, ok := topo.Position(g.Index)
		if !ok {
			return nil, fmt.Errorf("pool %q: device %q (index %d) is missing from the decoded topology", pool, g.Device.Name, g.Index)
		}
		g.Pos = p
		out.GPUs[p] = g
		filled[p] = true
	}
	for p, ok := range filled {
		if !ok {
			return nil, fmt.Errorf("pool %q: topology position %d has no device", pool, p)
		}
	}
	return out, nil
}

// IsIncomplete reports whether err says a pool is still being published.
func IsIncomplete(err error) bool {
	var incomplete *IncompletePoolError
	return errors.As(err, &incomplete)
}

// decodeGPU reads a whole-GPU device. Its name carries the index, which
// the index attribute, where published, must repeat.
func decodeGPU(dev *resourceapi.Device) (GPU, error) {
	idx, err := driver.ParseDeviceName(dev.Name)
	if err != nil {
		return GPU{}, err
	}
	if a, ok := Attribute(dev, driver.AttrIndex); ok {
		if a.IntValue == nil || *a.IntValue != int64(idx) {
			return GPU{}, fmt.Errorf("device %q: attribute %s=%v does not match the index in its name", dev.Name, driver.AttrIndex, attributeString(a))
		}
	}
	return GPU{Device: dev, Index: idx, Pos: -1}, nil
}

// decodeMIGDevice reads a MIG device. Its name carries the parent's
// index, which the parentIndex attribute must repeat.
func decodeMIGDevice(dev *resourceapi.Device) (MIGDevice, error) {
	parent, _, _, err := driver.ParseMIGDeviceName(dev.Name)
	if err != nil {
		return MIGDevice{}, err
	}
	m := MIGDevice{Device: dev, Parent: parent}
	intAttr := func(name string) (int, bool) {
		a, ok := dev.Attributes[resourceapi.QualifiedName(name)]
		if !ok || a.IntValue == nil {
			return 0, false
		}
		return int(*a.IntValue), true
	}
	if p, ok := intAttr(driver.AttrParentIndex); !ok || p != parent {
		return MIGDevice{}, fmt.Errorf("device %q: attribute %s must be the int %d of its name", dev.Name, driver.AttrParentIndex, parent)
	}
	if a, ok := dev.Attributes[driver.AttrMIGProfile]; ok && a.StringValue != nil {
		m.Profile = *a.StringValue
	} else {
		return MIGDevice{}, fmt.Errorf("device %q: attribute %s (string) is missing", dev.Name, driver.AttrMIGProfile)
	}
	start, okStart := intAttr(driver.AttrPlacementStart)
	size, okSize := intAttr(driver.AttrPlacementSize)
	if !okStart || !okSize || start < 0 || size <= 0 {
		return MIGDevice{}, fmt.Errorf("device %q: attributes %s and %s must be ints, start >= 0 and size > 0", dev.Name, driver.AttrPlacementStart, driver.AttrPlacementSize)
	}
	m.Placement = mig.Placement{Start: start, Size: size}
	if c, ok := dev.Capacity[driver.CapacityMemory]; ok {
		m.MemoryBytes = c.Value.Value()
	}
	if dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations {
		return MIGDevice{}, fmt.Errorf("device %q: a MIG device must not allow multiple allocations", dev.Name)
	}
	return m, nil
}

// topologyGPU is the identity a whole-GPU device publishes, as the
// topology model holds it (NUMANode -1 when unpublished).
func topologyGPU(dev *resourceapi.Device, index int) topology.GPU {
	str := func(name string) string {
		if a, ok := Attribute(dev, name); ok {
			switch {
			case a.StringValue != nil:
				return *a.StringValue
			case a.VersionValue != nil:
				return *a.VersionValue
			}
		}
		return ""
	}
	g := topology.GPU{
		Index:                 index,
		Minor:                 index,
		UUID:                  str(driver.AttrUUID),
		ProductName:           str(driver.AttrProductName),
		Architecture:          str(driver.AttrArchitecture),
		CUDAComputeCapability: str(driver.AttrCUDAComputeCapability),
		DriverVersion:         str(driver.AttrDriverVersion),
		PCIBusID:              str(driver.AttrPCIBusID),
		PCIeRoot:              str(driver.AttrPCIeRoot),
		Clique:                str(driver.AttrCliqueID),
		NUMANode:              -1,
	}
	if a, ok := Attribute(dev, driver.AttrMinor); ok && a.IntValue != nil {
		g.Minor = int(*a.IntValue)
	}
	if a, ok := Attribute(dev, driver.AttrNUMANode); ok && a.IntValue != nil {
		g.NUMANode = int(*a.IntValue)
	}
	if c, ok := Capacity(dev, driver.CapacityMemory); ok {
		g.MemoryBytes = c.Value.Value()
	}
	return g
}

// qualify returns the fully qualified form of an attribute or capacity
// name; names without a domain belong to gpulink's driver.
func qualify(name string) resourceapi.FullyQualifiedName {
	if strings.Contains(name, "/") {
		return resourceapi.FullyQualifiedName(name)
	}
	return resourceapi.FullyQualifiedName(driver.Name + "/" + name)
}

// Attribute returns a device's attribute by short (gpulink's own) or
// fully qualified name; in a slice, the driver's own attributes may go by
// either.
func Attribute(dev *resourceapi.Device, name string) (resourceapi.DeviceAttribute, bool) {
	return Lookup(dev.Attributes, driver.Name, qualify(name))
}

// Capacity is Attribute for capacities.
func Capacity(dev *resourceapi.Device, name string) (resourceapi.DeviceCapacity, bool) {
	return Lookup(dev.Capacity, driver.Name, qualify(name))
}

// Lookup finds a fully qualified name in a device's attributes or
// capacities as the publishing driver (driverName) wrote them: its own
// names may be short.
func Lookup[V any](m map[resourceapi.QualifiedName]V, driverName string, fq resourceapi.FullyQualifiedName) (V, bool) {
	if short, ok := strings.CutPrefix(string(fq), driverName+"/"); ok {
		if v, ok := m[resourceapi.QualifiedName(short)]; ok {
			return v, true
		}
	}
	v, ok := m[resourceapi.QualifiedName(fq)]
	return v, ok
}

// attributeString renders an attribute value for messages.
func attributeString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	default:
		return "<unset>"
	}
}

// WholeGPUMemory returns the memory capacity of each whole GPU one of
// gpulink's slices publishes, nil for another driver's slice. MIG devices
// and partitions are left out: they are no GPU a share or a percentage of GPU memory
// could be taken from.
func WholeGPUMemory(slice *resourceapi.ResourceSlice) []int64 {
	if slice.Spec.Driver != driver.Name {
		return nil
	}
	var sizes []int64
	for i := range slice.Spec.Devices {
		dev := &slice.Spec.Devices[i]
		if driver.IsMIGDeviceName(dev.Name) || driver.IsPartitionDeviceName(dev.Name) {
			continue
		}
		if c, ok := Capacity(dev, driver.CapacityMemory); ok {
			sizes = append(sizes, c.Value.Value())
		}
	}
	return sizes
}
