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
	// AttrLinks carries the GPU's row of the node's link matrix; see
	// topology.EncodeLinkRow for the format.
	AttrLinks = "links" // string
	// AttrGroupPrefix+k (e.g. "group4") is the ID of the best-aligned group
	// of k GPUs the device belongs to, for matchAttribute constraints.
	AttrGroupPrefix = "group" // int
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
