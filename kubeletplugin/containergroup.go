package kubeletplugin

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

// Container groups.
//
// A container that uses two claims (NVIDIA's bats gpu-two-claims-one-pod)
// gets both claims' CDI devices, and each claim's spec sets
// NVIDIA_VISIBLE_DEVICES and GPULINK_DEVICE_<i>; the last applied wins, so
// the container would see one claim's GPUs there, numbered from 0 as if
// they were all. The plugin does not see pods; the controller, which does,
// names in driver.ContainerClaimsAnnotation the claims that every
// container using one of them uses together. Each of those claims' specs
// then sets the variables for all their GPUs, numbered as one set in the
// order CUDA numbers them, so whichever comes last says the same.
//
// The annotation is only believed when it is consistent: every claim it
// names is in this call (the kubelet prepares all the claims of a pod for
// a driver in one call, so they belong to the same pod), is prepared here
// with gpulink GPUs, and carries the same annotation. Anyone who can write
// the claims can write the annotation too; the worst a wrong one does is
// list, in the environment of the pod's own containers, GPUs of the pod's
// own claims. MPS shares keep the claim's own environment: a process with
// CUDA_MPS_PIPE_DIRECTORY set sees only its MPS server's GPUs, so no set
// spanning two claims can be numbered for it.

// joinContainerGroups sets ContainerPeers of the claims planned in this
// call whose annotation holds, and logs why where it does not.
func joinContainerGroups(logger klog.Logger, claims []*resourceapi.ResourceClaim, planned map[string]*PreparedClaim) {
	byName := map[string]*resourceapi.ResourceClaim{}
	for _, c := range claims {
		byName[c.Namespace+"/"+c.Name] = c
	}
	for _, c := range claims {
		group := c.Annotations[driver.ContainerClaimsAnnotation]
		pc := planned[c.Namespace+"/"+c.Name]
		// Claims prepared before keep the spec their containers got.
		if group == "" || pc == nil || pc.UID != c.UID || pc.State != PrepareStarted {
			continue
		}
		peers, err := containerPeers(c, group, byName, planned)
		if err != nil {
			logger.Info("Not numbering the GPUs of the claims a container uses together; each claim's environment describes its own GPUs",
				"claim", klog.KObj(c), "annotation", driver.ContainerClaimsAnnotation, "value", group, "reason", err.Error())
			continue
		}
		pc.ContainerPeers = peers
	}
}

// containerPeers checks a claim's group and returns the GPUs of its other
// members.
func containerPeers(c *resourceapi.ResourceClaim, group string, byName map[string]*resourceapi.ResourceClaim, planned map[string]*PreparedClaim) ([]PreparedDevice, error) {
	members := strings.Split(group, ",")
	if !slices.Contains(members, c.Name) {
		return nil, fmt.Errorf("the group does not name the claim itself")
	}
	var peers []PreparedDevice
	for _, m := range members {
		key := c.Namespace + "/" + m
		other, ok := byName[key]
		if !ok {
			return nil, fmt.Errorf("claim %s is not prepared with it for the same pod", key)
		}
		if got := other.Annotations[driver.ContainerClaimsAnnotation]; got != group {
			return nil, fmt.Errorf("claim %s has %s=%q", key, driver.ContainerClaimsAnnotation, got)
		}
		pc := planned[key]
		if pc == nil || len(pc.Devices) == 0 {
			return nil, fmt.Errorf("claim %s has no GPUs of this driver prepared here", key)
		}
		for _, d := range pc.Devices {
			if d.Share != nil && d.Share.Strategy == apiv1alpha1.SharingMPS {
				return nil, fmt.Errorf("claim %s has an MPS share (%s): an MPS client sees only its server's GPUs", key, d.Device)
			}
		}
		if m == c.Name {
			continue
		}
		for _, d := range pc.Devices {
			d.CDIDeviceID = ""
			if d.Share != nil {
				s := *d.Share
				s.MPSRef = false
				d.Share = &s
			}
			peers = append(peers, d)
		}
	}
	return peers, nil
}
