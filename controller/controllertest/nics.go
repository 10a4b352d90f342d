package controllertest

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver/topology"
)

// NICDriver is the test suite's own NIC driver: it publishes slices (and
// prepares nothing), standing for an RDMA NIC DRA driver next to gpulink.
const NICDriver = "nic.test.example.com"

// NICClass is the DeviceClass of NICDriver's devices.
const NICClass = "nic.test.example.com"

// WithPCIeRoots gives GPU i of t the PCIe root complex roots[i] (and a PCI
// bus ID, without which none is published), so that its slice carries
// resource.kubernetes.io/pcieRoot as the kubelet plugin publishes it. It
// returns t, modified.
func WithPCIeRoots(t *topology.Topology, roots []string) (*topology.Topology, error) {
	if len(roots) != len(t.GPUs) {
		return nil, fmt.Errorf("%d PCIe roots for %d GPUs", len(roots), len(t.GPUs))
	}
	for i := range t.GPUs {
		t.GPUs[i].PCIBusID = fmt.Sprintf("0000:%02x:00.0", 0x10+i)
		t.GPUs[i].PCIeRoot = roots[i]
	}
	return t, nil
}

// NIC is one device of NICDriver.
type NIC struct {
	Name     string
	PCIeRoot string
	// NUMANode, when set, is published as resource.kubernetes.io/numaNode.
	NUMANode *int64
	Taints   []resourceapi.DeviceTaint
}

// NICSlice is the slice NICDriver publishes on a node: pool = node, one
// device per NIC with its PCIe root and NUMA node (where set) under the
// standard attribute names.
func NICSlice(node string, nics []NIC) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + NICDriver},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   NICDriver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	for _, n := range nics {
		d := resourceapi.Device{
			Name: n.Name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": {StringValue: ptr.To("rdma")},
			},
			Taints: n.Taints,
		}
		if n.PCIeRoot != "" {
			d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(n.PCIeRoot)}
		}
		if n.NUMANode != nil {
			d.Attributes[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: n.NUMANode}
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
	}
	return s
}

// NICDeviceClass selects NICDriver's devices.
func NICDeviceClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: NICClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", NICDriver)}}}},
	}
}

// NICRequest asks for count devices of NICDeviceClass.
func NICRequest(name string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: NICClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

// MatchPCIeRoot is a constraint that the requests' devices share a PCIe
// root complex (all requests when none are named).
func MatchPCIeRoot(requests ...string) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{Requests: requests, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributePCIeRoot))}
}

// MatchNUMANode is a constraint that the requests' devices share a NUMA
// node (all requests when none are named).
func MatchNUMANode(requests ...string) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{Requests: requests, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributeNUMANode))}
}
