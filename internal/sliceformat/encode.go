// Package sliceformat is the one home of the format of gpulink's
// ResourceSlices: Encode turns a node's topology into the devices the
// kubelet plugin publishes, DecodePool reads a pool back into GPUs, MIG
// devices and the link topology for the controller, the admission webhook
// and the test views. The attribute and capacity names themselves are in
// package driver (names.go), which users select on.
package sliceformat

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// API limits of resource.k8s.io/v1 that the published slices must respect.
const (
	maxAttributesAndCapacities = resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice
	maxAttributeValueLength    = resourceapi.DeviceAttributeMaxValueLength
	maxAttributeIDLength       = resourceapi.DeviceMaxIDLength
	maxDevicesPerSlice         = 128
	maxTaintedDevicesPerSlice  = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
	maxCounterSetsPerSlice     = resourceapi.ResourceSliceMaxCounterSets
	maxCountersPerSet          = resourceapi.ResourceSliceMaxCountersPerCounterSet
	maxCountersPerConsumption  = resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption
)

// Share request policy: memory is handed out in MiB steps, cores in
// percent of the GPU.
const (
	MemoryStep = 1 << 20 // 1Mi
	CoresTotal = 100
)

// Options are the knobs of Encode.
type Options struct {
	// ManagedByController puts the driver.ManagedTaintKey NoSchedule taint
	// on every device.
	ManagedByController bool
	// DefaultShareMemory is the memory a share consumes when its request
	// does not ask for memory; clamped to [1Mi, GPU memory].
	DefaultShareMemory resource.Quantity
	// DefaultShareCores is the cores percentage a share consumes when its
	// request does not ask for cores; clamped to [1, 100].
	DefaultShareCores int64
	// PCIeRootFromSysfs resolves the PCIe root of a GPU whose discovery
	// did not report one from this host's sysfs. Only for real GPUs: the
	// synthetic bus IDs of topology-file discovery could name an unrelated
	// device of the host.
	PCIeRootFromSysfs bool
	// PCIeRootModifiers configure that lookup (tests point it at a fake
	// sysfs).
	PCIeRootModifiers []deviceattribute.MachineModifier
	// MayTaint: devices may get taints later (health), so slices hold at
	// most the API's limit of tainted devices.
	MayTaint bool
}

// Slice is the content of one ResourceSlice of a pool: devices or counter
// sets, never both (the API refuses a slice with both).
type Slice struct {
	Devices        []resourceapi.Device
	SharedCounters []resourceapi.CounterSet
}

// Encode turns a node's topology into the devices of the ResourceSlices
// the kubelet plugin publishes in one pool named after the node, split
// into slices: one device per GPU not in MIG mode and one per MIG device
// of the GPUs in MIG mode. There is always at least one (possibly empty)
// slice: an empty pool shows the driver is running on a node without GPUs.
// It returns an error, and nothing to publish, when any device would break
// an API limit; nothing is ever dropped silently. A node with GPUs
// partitioned on demand needs counter sets, which only EncodeSlices
// encodes.
func Encode(logger klog.Logger, nodeName string, t *topology.Topology, opts Options) ([][]resourceapi.Device, error) {
	slices, err := EncodeSlices(logger, nodeName, t, opts)
	if err != nil {
		return nil, err
	}
	out := make([][]resourceapi.Device, 0, len(slices))
	for _, s := range slices {
		if len(s.SharedCounters) > 0 {
			return nil, fmt.Errorf("building ResourceSlices of node %s: GPUs partitioned on demand (MIG on demand) need counter sets: use EncodeSlices", nodeName)
		}
		out = append(out, s.Devices)
	}
	return out, nil
}

// EncodeSlices is Encode for any node: besides the devices Encode
// publishes, the GPUs in MIG mode partitioned on demand
// (mig.GPU.OnDemand) are published as their partitions
// (encode_ondemand.go), devices that consume counters of one counter set
// per GPU; the counter sets follow the devices, in slices of their own.
func EncodeSlices(logger klog.Logger, nodeName string, t *topology.Topology, opts Options) ([]Slice, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("building ResourceSlices: node name is empty")
	}
	whole, err := wholeGPUs(t)
	if err != nil {
		return nil, fmt.Errorf("building ResourceSlices of node %s: GPUs not in MIG mode: %w", nodeName, err)
	}
	devices := make([]resourceapi.Device, 0, t.Len())
	groupSizes := topology.GroupSizes(whole.Len())
	for p := range whole.GPUs {
		dev, err := encodeGPU(logger, whole, p, groupSizes, opts)
		if err != nil {
			return nil, fmt.Errorf("building ResourceSlice device for GPU %d on node %s: %w", whole.GPUs[p].Index, nodeName, err)
		}
		devices = append(devices, dev)
	}
	migDevices, err := encodeMIGDevices(logger, t, opts)
	if err != nil {
		return nil, fmt.Errorf("building ResourceSlices of node %s: %w", nodeName, err)
	}
	devices = append(devices, migDevices...)
	partitions, counterSets, err := encodePartitions(logger, t, opts)
	if err != nil {
		return nil, fmt.Errorf("building ResourceSlices of node %s: %w", nodeName, err)
	}
	devices = append(devices, partitions...)
	perSlice := maxDevicesPerSlice
	if opts.ManagedByController || opts.MayTaint || len(partitions) > 0 {
		perSlice = maxTaintedDevicesPerSlice
	}
	slices := []Slice{{}}
	if len(devices) > 0 {
		slices = slices[:0]
		for start := 0; start < len(devices); start += perSlice {
			end := min(start+perSlice, len(devices))
			slices = append(slices, Slice{Devices: devices[start:end]})
		}
	}
	for start := 0; start < len(counterSets); start += maxCounterSetsPerSlice {
		end := min(start+maxCounterSetsPerSlice, len(counterSets))
		slices = append(slices, Slice{SharedCounters: counterSets[start:end]})
	}
	for i, s := range slices {
		if err := validateSlice(s.Devices, perSlice); err != nil {
			return nil, fmt.Errorf("ResourceSlice %d of pool %s: %w", i, nodeName, err)
		}
		if err := validateCounterSets(s.SharedCounters); err != nil {
			return nil, fmt.Errorf("ResourceSlice %d of pool %s: %w", i, nodeName, err)
		}
	}
	return slices, nil
}

func encodeGPU(logger klog.Logger, t *topology.Topology, p int, groupSizes []int, opts Options) (resourceapi.Device, error) {
	g := t.GPUs[p]
	attrs, err := identityAttributes(logger, g, opts)
	if err != nil {
		return resourceapi.Device{}, err
	}
	attrs[driver.AttrIndex] = intAttr(int64(g.Index))
	attrs[driver.AttrMinor] = intAttr(int64(g.Minor))
	attrs[driver.AttrNVLinkIsland] = intAttr(int64(t.IslandOf(p)))
	for _, k := range groupSizes {
		if id, ok := t.GroupOf(k, p); ok {
			attrs[resourceapi.QualifiedName(driver.GroupAttr(k))] = intAttr(int64(id))
		}
	}
	links, err := topology.EncodeLinkRow(t, p)
	if err != nil {
		return resourceapi.Device{}, fmt.Errorf("attribute %s: %w", driver.AttrLinks, err)
	}
	attrs[driver.AttrLinks] = resourceapi.DeviceAttribute{StringValue: ptr.To(links)}

	capacity, err := buildCapacity(g, opts)
	if err != nil {
		return resourceapi.Device{}, err
	}
	dev := resourceapi.Device{
		Name:                     driver.DeviceName(g.Index),
		Attributes:               attrs,
		Capacity:                 capacity,
		AllowMultipleAllocations: ptr.To(true),
	}
	dev.Taints = managedTaints(opts)
	return dev, nil
}

// managedTaints are the taints every published device carries: gpulink's
// managed taint when the controller allocates the node's devices, so that
// kube-scheduler's own allocator leaves them alone.
func managedTaints(opts Options) []resourceapi.DeviceTaint {
	if !opts.ManagedByController {
		return nil
	}
	return []resourceapi.DeviceTaint{{
		Key:    driver.ManagedTaintKey,
		Value:  "true",
		Effect: resourceapi.DeviceTaintEffectNoSchedule,
	}}
}

// identityAttributes are the attributes a GPU and its MIG devices share:
// UUID, product, architecture, versions, NUMA node and PCI placement.
func identityAttributes(logger klog.Logger, g topology.GPU, opts Options) (map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	setString := func(name, value string) {
		if value != "" {
			attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{StringValue: ptr.To(value)}
		}
	}
	setString(driver.AttrUUID, g.UUID)
	setString(driver.AttrProductName, g.ProductName)
	setString(driver.AttrArchitecture, g.Architecture)
	// A MIG device is in its GPU's clique: the clique is a property of
	// the physical GPU's NVLinks.
	setString(driver.AttrCliqueID, g.Clique)
	for _, v := range []struct{ name, value string }{
		{driver.AttrCUDAComputeCapability, g.CUDAComputeCapability},
		{driver.AttrDriverVersion, g.DriverVersion},
	} {
		if v.value == "" {
			continue
		}
		sv, err := normalizeVersion(v.value)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", v.name, err)
		}
		attrs[resourceapi.QualifiedName(v.name)] = resourceapi.DeviceAttribute{VersionValue: ptr.To(sv)}
	}
	if g.NUMANode >= 0 {
		attrs[driver.AttrNUMANode] = intAttr(int64(g.NUMANode))
		// The standard name too (KEP-5491, deviceattribute's scalar
		// form), so that claims align GPUs with CPUs and other drivers'
		// devices by matchAttribute on one name.
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = intAttr(int64(g.NUMANode))
	}
	if g.PCIBusID != "" {
		busID := strings.ToLower(g.PCIBusID)
		a, err := deviceattribute.GetPCIBusIDAttribute(busID)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", driver.AttrPCIBusID, err)
		}
		attrs[a.Name] = a.Value
		switch {
		case g.PCIeRoot != "":
			attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIeRoot)}
		case opts.PCIeRootFromSysfs:
			root, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, opts.PCIeRootModifiers...)
			if err != nil {
				// Not knowing the root complex only loses a matchAttribute
				// hint; say so instead of failing the whole node.
				logger.Info("PCIe root unknown, not publishing it", "gpu", g.Index, "pciBusID", busID, "err", err)
			} else {
				attrs[root.Name] = root.Value
			}
		}
	}
	return attrs, nil
}

// buildCapacity declares the memory and cores capacities with the request
// policies that make a device consumable in shares.
func buildCapacity(g topology.GPU, opts Options) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, error) {
	maxMem := g.MemoryBytes / MemoryStep * MemoryStep
	if maxMem < 2*MemoryStep {
		// The API needs min+step <= value; a GPU without known memory
		// cannot be shared and must not be published with a made-up size.
		return nil, fmt.Errorf("capacity %s: GPU memory %d bytes is unknown or smaller than 2Mi (use --gpu-memory with topology-file discovery)", driver.CapacityMemory, g.MemoryBytes)
	}
	defMem := opts.DefaultShareMemory.Value() / MemoryStep * MemoryStep
	defMem = min(max(defMem, MemoryStep), maxMem)
	defCores := min(max(opts.DefaultShareCores, 1), CoresTotal)
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		driver.CapacityMemory: {
			Value: *resource.NewQuantity(g.MemoryBytes, resource.BinarySI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(defMem, resource.BinarySI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(MemoryStep, resource.BinarySI),
					Max:  resource.NewQuantity(maxMem, resource.BinarySI),
					Step: resource.NewQuantity(MemoryStep, resource.BinarySI),
				},
			},
		},
		driver.CapacityCores: {
			Value: *resource.NewQuantity(CoresTotal, resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(defCores, resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(1, resource.DecimalSI),
					Max:  resource.NewQuantity(CoresTotal, resource.DecimalSI),
					Step: resource.NewQuantity(1, resource.DecimalSI),
				},
			},
		},
	}, nil
}

var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validateSlice checks the per-slice and per-device limits the API server
// enforces, so a violation fails here with a clear message instead of as an
// asynchronous rejection of the whole slice.
func validateSlice(devices []resourceapi.Device, perSlice int) error {
	if len(devices) > perSlice {
		return fmt.Errorf("%d devices, at most %d allowed", len(devices), perSlice)
	}
	tainted := false
	for _, d := range devices {
		if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 {
			tainted = true
		}
		for _, c := range d.ConsumesCounters {
			if len(c.Counters) > maxCountersPerConsumption {
				return fmt.Errorf("device %s: consumes %d counters of counter set %s, at most %d allowed", d.Name, len(c.Counters), c.CounterSet, maxCountersPerConsumption)
			}
		}
		if n := len(d.Attributes) + len(d.Capacity); n > maxAttributesAndCapacities {
			return fmt.Errorf("device %s: %d attributes and capacities, at most %d allowed", d.Name, n, maxAttributesAndCapacities)
		}
		names := make([]string, 0, len(d.Attributes)+len(d.Capacity))
		for name := range d.Attributes {
			names = append(names, string(name))
		}
		for name := range d.Capacity {
			names = append(names, string(name))
		}
		sort.Strings(names)
		for _, name := range names {
			id := name
			if i := strings.LastIndexByte(name, '/'); i >= 0 {
				id = name[i+1:]
			}
			if len(id) > maxAttributeIDLength || !cIdentifier.MatchString(id) {
				return fmt.Errorf("device %s: name %q: the part after the domain must be a C identifier of at most %d characters", d.Name, name, maxAttributeIDLength)
			}
		}
		for name, a := range d.Attributes {
			for _, v := range []*string{a.StringValue, a.VersionValue} {
				if v != nil && len(*v) > maxAttributeValueLength {
					return fmt.Errorf("device %s: attribute %s: value %q is %d characters long, at most %d allowed", d.Name, name, *v, len(*v), maxAttributeValueLength)
				}
			}
		}
	}
	if tainted && len(devices) > maxTaintedDevicesPerSlice {
		return fmt.Errorf("%d devices with taints or counters, at most %d allowed", len(devices), maxTaintedDevicesPerSlice)
	}
	return nil
}

// validateCounterSets checks the API's limits on a slice's counter sets.
func validateCounterSets(sets []resourceapi.CounterSet) error {
	if len(sets) > maxCounterSetsPerSlice {
		return fmt.Errorf("%d counter sets, at most %d allowed", len(sets), maxCounterSetsPerSlice)
	}
	for _, cs := range sets {
		if len(cs.Counters) > maxCountersPerSet {
			return fmt.Errorf("counter set %s: %d counters, at most %d allowed", cs.Name, len(cs.Counters), maxCountersPerSet)
		}
	}
	return nil
}

func intAttr(v int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &v} }

var (
	numericVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+){0,2}$`)
	// semver 2.0.0, from semver.org.
	semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)
)

// normalizeVersion turns a version as NVIDIA reports it into semver 2.0.0,
// which VersionValue requires: missing components are zero ("8.0" becomes
// "8.0.0", "550" becomes "550.0.0") and leading zeros are dropped
// ("535.104.05" becomes "535.104.5"). A value that already is valid semver
// is kept; anything else is an error.
func normalizeVersion(v string) (string, error) {
	if numericVersion.MatchString(v) {
		parts := strings.Split(v, ".")
		out := make([]string, 3)
		for i := range out {
			out[i] = "0"
			if i < len(parts) {
				n, err := strconv.ParseUint(parts[i], 10, 64)
				if err != nil {
					return "", fmt.Errorf("version %q: component %q: %w", v, parts[i], err)
				}
				out[i] = strconv.FormatUint(n, 10)
			}
		}
		return strings.Join(out, "."), nil
	}
	if semverRE.MatchString(v) {
		return v, nil
	}
	return "", fmt.Errorf("version %q is neither MAJOR[.MINOR[.PATCH]] nor semver 2.0.0", v)
}
