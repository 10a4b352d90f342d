// Package driver holds the names gpulink's components agree on: the DRA
// driver name, device names, and the attribute and capacity names the
// kubelet plugin publishes and the controller reads back. Its subpackages
// are the domain core (topology model, allocator) and import no client-go.
package driver

import (
	"fmt"
	"strconv"
	"strings"
)

// Name is the DRA driver name, the domain of every attribute gpulink publishes.
const Name = "gpu.gpulink.dev"

// Names shared by the kubelet plugin, the controller and the Helm chart.
const (
	// DeviceClassWhole selects whole GPUs, given out exclusively.
	DeviceClassWhole = "gpu.gpulink.dev"
	// DeviceClassShare selects a memory/core share of one GPU.
	DeviceClassShare = "gpu-share.gpulink.dev"
	// DeviceClassMIG selects MIG devices (instances of a GPU in MIG mode).
	DeviceClassMIG = "mig.gpulink.dev"
	// DeviceClassShareConcurrent selects a share of one GPU whose clients
	// run side by side with the other concurrent shares of its namespace
	// on that GPU, under one MPS server (sharing.mpsMode Concurrent).
	DeviceClassShareConcurrent = "gpu-share-concurrent.gpulink.dev"
	// ManagedTaintKey is the device taint (effect NoSchedule) the kubelet
	// plugin puts on every device when the controller allocates them, so
	// kube-scheduler never allocates a gpulink device itself.
	ManagedTaintKey = "gpu.gpulink.dev/managed-by-controller"
	// UnhealthyTaintKey is the device taint the kubelet plugin puts on a
	// GPU with a fatal health condition (value: the condition, e.g.
	// "xid-79"); NoSchedule or NoExecute as configured.
	UnhealthyTaintKey = "gpu.gpulink.dev/unhealthy"
	// SchedulingGate holds pods back from kube-scheduler until the
	// controller has allocated their gpulink claims.
	SchedulingGate = "gpu.gpulink.dev/allocation"
	// ClaimFinalizer is the controller's finalizer on claims it allocated.
	ClaimFinalizer = "gpu.gpulink.dev/allocation"
	// ContainerClaimsAnnotation names (comma-separated, sorted, itself
	// included) the claims a pod's containers use together, always all of
	// them in every container that uses one: the controller sets it, the
	// kubelet plugin then numbers their GPUs as one set in each claim's
	// container environment.
	ContainerClaimsAnnotation = "gpu.gpulink.dev/container-claims"
)

// Device attribute names (unqualified: the API qualifies them with Name).
// They reuse the NVIDIA GPU DRA driver's names where one exists so users can
// move CEL selectors over unchanged.
const (
	AttrIndex                 = "index"                 // int
	AttrMinor                 = "minor"                 // int
	AttrUUID                  = "uuid"                  // string
	AttrProductName           = "productName"           // string
	AttrArchitecture          = "architecture"          // string
	AttrCUDAComputeCapability = "cudaComputeCapability" // version
	AttrDriverVersion         = "driverVersion"         // version
	AttrNUMANode              = "numaNode"              // int
	AttrNVLinkIsland          = "nvlinkIsland"          // int
	// AttrCliqueID is the GPU's multi-node NVLink clique (GB200/GB300
	// NVL72): "<cluster UUID>.<clique ID>", the value GPU Feature
	// Discovery gives the node label nvidia.com/gpu.clique. Published
	// only when NVML reports the GPU's fabric registration completed
	// successfully; absent on GPUs without a multi-node NVLink fabric.
	AttrCliqueID = "cliqueID" // string
	// AttrLinks carries the GPU's row of the node's link matrix; see
	// topology.EncodeLinkRow for the format.
	AttrLinks = "links" // string
	// AttrGroupPrefix+k (e.g. "group4") is the ID of the best-aligned group
	// of k GPUs the device belongs to, for matchAttribute constraints.
	AttrGroupPrefix = "group" // int
	// AttrType tells whole GPUs (DeviceTypeGPU) from MIG devices
	// (DeviceTypeMIG), so that a class selects one kind.
	AttrType = "type" // string
)

// Values of AttrType.
const (
	DeviceTypeGPU = "gpu"
	DeviceTypeMIG = "mig"
)

// MIG device attributes, besides AttrType, AttrUUID ("MIG-..."), the
// parent's AttrProductName, AttrArchitecture, AttrCUDAComputeCapability,
// AttrDriverVersion, AttrNUMANode and the standard PCI attributes.
const (
	AttrMIGProfile      = "profile"         // string, e.g. "1g.5gb"
	AttrParentIndex     = "parentIndex"     // int, the GPU's nvidia-smi index
	AttrParentUUID      = "parentUUID"      // string
	AttrGPUInstance     = "gpuInstance"     // int, NVML GPU instance ID
	AttrComputeInstance = "computeInstance" // int, NVML compute instance ID
	AttrPlacementStart  = "placementStart"  // int, first memory slice
	AttrPlacementSize   = "placementSize"   // int, memory slices
	AttrMultiprocessors = "multiprocessors" // int, SMs of the compute instance
	AttrCopyEngines     = "copyEngines"     // int
	AttrDecoders        = "decoders"        // int
	AttrEncoders        = "encoders"        // int
	AttrJPEGEngines     = "jpegEngines"     // int
	AttrOFAEngines      = "ofaEngines"      // int
)

// Standard attribute names from k8s.io/dynamic-resource-allocation/deviceattribute.
const (
	AttrPCIBusID = "resource.kubernetes.io/pciBusID"
	AttrPCIeRoot = "resource.kubernetes.io/pcieRoot"
)

// Capacity names.
const (
	CapacityMemory = "memory" // bytes
	CapacityCores  = "cores"  // percent of the GPU's SMs, 100 = whole GPU
)

// GroupAttr returns the attribute name of the aligned group of size k.
func GroupAttr(k int) string { return AttrGroupPrefix + strconv.Itoa(k) }

// DeviceName returns the ResourceSlice device name of the GPU with the given index.
func DeviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

// MIGDeviceName returns the ResourceSlice device name of the MIG device
// with compute instance ci in GPU instance gi of the GPU with the given
// index: gpu-<index>-mig-<gi>-<ci>. It starts with the parent's name, so
// sorted lists keep a GPU's MIG devices together.
func MIGDeviceName(parent, gi, ci int) string {
	return DeviceName(parent) + "-mig-" + strconv.Itoa(gi) + "-" + strconv.Itoa(ci)
}

// IsMIGDeviceName reports whether a device name has the form of
// MIGDeviceName (valid or not), so that readers route it to the MIG code
// instead of refusing it as a malformed GPU name.
func IsMIGDeviceName(name string) bool {
	return strings.HasPrefix(name, "gpu-") && strings.Contains(name, "-mig-")
}

// ParseMIGDeviceName returns the parent GPU index and the GPU and compute
// instance IDs encoded in a MIG device name.
func ParseMIGDeviceName(name string) (parent, gi, ci int, err error) {
	gpu, rest, ok := strings.Cut(name, "-mig-")
	if !ok {
		return 0, 0, 0, fmt.Errorf("device name %q: want gpu-<index>-mig-<gi>-<ci>", name)
	}
	if parent, err = ParseDeviceName(gpu); err != nil {
		return 0, 0, 0, fmt.Errorf("device name %q: want gpu-<index>-mig-<gi>-<ci>: %w", name, err)
	}
	giText, ciText, ok := strings.Cut(rest, "-")
	gi, giErr := parseID(giText)
	ci, ciErr := parseID(ciText)
	if !ok || giErr != nil || ciErr != nil {
		return 0, 0, 0, fmt.Errorf("device name %q: want gpu-<index>-mig-<gi>-<ci> with non-negative decimal instance IDs", name)
	}
	return parent, gi, ci, nil
}

// parseID accepts a non-negative decimal without leading zeros or sign.
func parseID(s string) (int, error) {
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || strconv.Itoa(i) != s {
		return 0, fmt.Errorf("%q is not a non-negative decimal", s)
	}
	return i, nil
}

// MIG on demand (driver/mig/ondemand.go): a GPU partitioned on demand is
// published as its partitions, devices named PartitionDeviceName that
// consume counters of the GPU's counter set MIGCounterSetName.
const (
	// CounterMemory is the memory (bytes) of the GPU's instances.
	CounterMemory = "memory"
	// CounterComputeSlices are the GPU's compute slices.
	CounterComputeSlices = "compute-slices"
)

// partitionInfix tells a partition's name from a GPU's and a MIG device's.
const partitionInfix = "-part-"

// PartitionDeviceName names the partition of MIG profile (e.g.
// "1g.5gb+me") at the placement starting at memory slice start of the GPU
// with the given index: gpu-<index>-part-<profile>-at-<start>, the profile
// made a DNS label ("." becomes "-", "+" "-with-", "-" "-no-":
// gpu-0-part-1g-5gb-with-me-at-3). It is stable: the same GPU, profile
// and placement always have the same name.
func PartitionDeviceName(parent int, profile string, start int) (string, error) {
	var b strings.Builder
	for _, r := range strings.ToLower(profile) {
		switch {
		case r == '.':
			b.WriteByte('-')
		case r == '+':
			b.WriteString("-with-")
		case r == '-':
			b.WriteString("-no-")
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			return "", fmt.Errorf("MIG profile %q: character %q has no place in a device name", profile, r)
		}
	}
	name := DeviceName(parent) + partitionInfix + b.String() + "-at-" + strconv.Itoa(start)
	if len(name) > 63 || strings.Contains(name, "--") || b.Len() == 0 || start < 0 {
		return "", fmt.Errorf("MIG profile %q at %d: device name %q is not a DNS label of at most 63 characters", profile, start, name)
	}
	return name, nil
}

// IsPartitionDeviceName reports whether a device name has the form of
// PartitionDeviceName, so that readers route it to the partition code.
func IsPartitionDeviceName(name string) bool {
	return strings.HasPrefix(name, "gpu-") && strings.Contains(name, partitionInfix)
}

// ParsePartitionParent returns the parent GPU index of a partition's name.
func ParsePartitionParent(name string) (int, error) {
	gpu, _, ok := strings.Cut(name, partitionInfix)
	if !ok {
		return 0, fmt.Errorf("device name %q: want gpu-<index>-part-<profile>-at-<start>", name)
	}
	i, err := ParseDeviceName(gpu)
	if err != nil {
		return 0, fmt.Errorf("device name %q: want gpu-<index>-part-<profile>-at-<start>: %w", name, err)
	}
	return i, nil
}

// MIGCounterSetName names the counter set of the GPU with the given index
// partitioned on demand.
func MIGCounterSetName(index int) string { return DeviceName(index) + "-mig" }

// MemorySliceCounter names the counter of memory slice k.
func MemorySliceCounter(k int) string { return "memory-slice-" + strconv.Itoa(k) }

// ProfileInstancesCounter names the counter of the instances of NVML GPU
// instance profile id, for profiles the GPU allows fewer of than they
// have placements.
func ProfileInstancesCounter(id int) string { return "profile-" + strconv.Itoa(id) + "-instances" }

// ParseDeviceName returns the GPU index encoded in a device name.
func ParseDeviceName(name string) (int, error) {
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return 0, fmt.Errorf("device name %q: want gpu-<index>", name)
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || strconv.Itoa(i) != rest {
		return 0, fmt.Errorf("device name %q: want gpu-<index> with a non-negative decimal index", name)
	}
	return i, nil
}

// ControlDeviceNodes are the NVIDIA device nodes every CUDA process needs
// besides the per-GPU /dev/nvidia<minor>.
func ControlDeviceNodes() []string {
	return []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
}
