// Package controllertest builds the objects gpulink's controller tests
// need: ResourceSlices with the device layout the kubelet plugin publishes
// (built from a topology, e.g. one of driver/topology/testdata), nodes and
// claims.
package controllertest

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// SliceOptions shape the published devices.
type SliceOptions struct {
	// MemoryBytes is each GPU's memory when the topology does not say (default 32Gi).
	MemoryBytes int64
	// DefaultShareMemory is the requestPolicy default (default 4Gi).
	DefaultShareMemory int64
	// DefaultShareCores is the requestPolicy default for cores (default 25).
	DefaultShareCores int64
	// Generation is the pool generation (default 1).
	Generation int64
}

// Slice returns the ResourceSlice the kubelet plugin publishes for a node
// with the given topology, encoded as the plugin encodes it
// (sliceformat.Encode: pool = node name, one device
// gpu-<index> per GPU, consumable memory and cores, the managed taint).
// GPUs of t without a memory size get o.MemoryBytes (t is modified).
func Slice(node string, t *topology.Topology, o SliceOptions) (*resourceapi.ResourceSlice, error) {
	if o.MemoryBytes == 0 {
		o.MemoryBytes = 32 << 30
	}
	if o.DefaultShareMemory == 0 {
		o.DefaultShareMemory = 4 << 30
	}
	if o.DefaultShareCores == 0 {
		o.DefaultShareCores = 25
	}
	if o.Generation == 0 {
		o.Generation = 1
	}
	for i := range t.GPUs {
		if t.GPUs[i].MemoryBytes == 0 {
			t.GPUs[i].MemoryBytes = o.MemoryBytes
		}
	}
	slices, err := sliceformat.Encode(klog.Background(), node, t, sliceformat.Options{
		ManagedByController: true,
		DefaultShareMemory:  *resource.NewQuantity(o.DefaultShareMemory, resource.BinarySI),
		DefaultShareCores:   o.DefaultShareCores,
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	if len(slices) != 1 {
		return nil, fmt.Errorf("node %s: want one slice, got %d", node, len(slices))
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driverSliceSuffix},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver.Name,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: o.Generation, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
			Devices:  slices[0],
		},
	}, nil
}

const driverSliceSuffix = "gpu.gpulink.dev"

// Node returns a Ready, schedulable API-only node.
func Node(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourcePods:   resource.MustParse("1000"),
				corev1.ResourceCPU:    resource.MustParse("1000"),
				corev1.ResourceMemory: resource.MustParse("1Ti"),
			},
			Allocatable: corev1.ResourceList{
				corev1.ResourcePods:   resource.MustParse("1000"),
				corev1.ResourceCPU:    resource.MustParse("1000"),
				corev1.ResourceMemory: resource.MustParse("1Ti"),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
}

// WholeRequest asks for count whole GPUs of the whole-GPU class.
func WholeRequest(name string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

// ShareRequest asks for one share with the given memory and cores (empty: defaults).
func ShareRequest(name, memory, cores string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassShare, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	if memory != "" || cores != "" {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		if memory != "" {
			r.Exactly.Capacity.Requests[driver.CapacityMemory] = resource.MustParse(memory)
		}
		if cores != "" {
			r.Exactly.Capacity.Requests[driver.CapacityCores] = resource.MustParse(cores)
		}
	}
	return r
}

// RequiredNVLinkConfig is a claim config entry requiring every pair NVLink.
func RequiredNVLinkConfig(requests ...string) resourceapi.DeviceClaimConfiguration {
	return OpaqueConfig(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","topology":{"policy":"Required","minLink":"NVLink"}}`, requests...)
}

// OpaqueConfig is a claim config entry for gpulink with raw parameters.
func OpaqueConfig(params string, requests ...string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name, Parameters: runtimeRaw(params)}},
	}
}

func runtimeRaw(s string) runtime.RawExtension { return runtime.RawExtension{Raw: []byte(s)} }

// ResourceList is a resource list of name, quantity pairs:
// ResourceList("cpu", "4", "memory", "8Gi").
func ResourceList(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}
