package controllertest

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// NVIDIA's ComputeDomains as its DRA driver (k8s-dra-driver-gpu) presents
// them to the API server: the DeviceClasses its chart ships, the slice its
// compute-domain kubelet plugin publishes on each node, and the request of
// the ResourceClaimTemplate a ComputeDomain creates for its pods. gpulink
// never allocates these devices; tests publish them to check that gpulink
// places the GPUs of pods claiming a channel and leaves the channel to
// kube-scheduler.

// ComputeDomainDriver is NVIDIA's ComputeDomain driver name.
const ComputeDomainDriver = "compute-domain.nvidia.com"

// ChannelClass is the DeviceClass of a ComputeDomain's default IMEX
// channel (channel 0).
const ChannelClass = "compute-domain-default-channel.nvidia.com"

// ComputeDomainClasses are the DeviceClasses NVIDIA's driver ships for
// ComputeDomains, with their selectors.
func ComputeDomainClasses() []*resourceapi.DeviceClass {
	class := func(name, expr string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
	}
	return []*resourceapi.DeviceClass{
		class(ChannelClass, "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0"),
		class("compute-domain-daemon.nvidia.com", "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'"),
	}
}

// ComputeDomainSlice is the slice NVIDIA's compute-domain kubelet plugin
// publishes on a node: pool = node, an IMEX channel device channel-<id>
// per channel (type channel, id) and the daemon device daemon-0 (type
// daemon, id 0), with its devices' attribute names.
func ComputeDomainSlice(node string, channels int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + ComputeDomainDriver},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   ComputeDomainDriver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	device := func(kind string, id int) resourceapi.Device {
		return resourceapi.Device{Name: fmt.Sprintf("%s-%d", kind, id), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To(kind)},
			"id":   {IntValue: ptr.To(int64(id))},
		}}
	}
	for id := range channels {
		s.Spec.Devices = append(s.Spec.Devices, device("channel", id))
	}
	s.Spec.Devices = append(s.Spec.Devices, device("daemon", 0))
	return s
}

// ChannelClaim is the claim a ComputeDomain's ResourceClaimTemplate gives
// each of its pods: the default channel, with the opaque config naming
// the domain (domainID) for NVIDIA's driver.
func ChannelClaim(domainID string) resourceapi.DeviceClaim {
	return resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{ChannelRequest()},
		Config: []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{"channel"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: ComputeDomainDriver,
				Parameters: runtime.RawExtension{Raw: fmt.Appendf(nil,
					`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainChannelConfig","domainID":%q,"allocationMode":"Single"}`, domainID)},
			}},
		}},
	}
}

// ChannelRequest asks for the default channel of a ComputeDomain.
func ChannelRequest() resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: "channel", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: ChannelClass}}
}
