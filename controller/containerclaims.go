package controller

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
)

// containerClaimGroups finds the gpulink claims a pod's containers use
// together (NVIDIA's bats gpu-two-claims-one-pod: one container, two
// claims from two templates). Each claim's CDI spec sets the container's
// NVIDIA_VISIBLE_DEVICES and GPULINK_DEVICE_<i>; the kubelet applies the
// claims one after the other and the last value wins, so without help a
// container sees one claim's GPUs there, numbered as if they were all.
// The kubelet plugin cannot see pods; the controller tells it, in
// driver.ContainerClaimsAnnotation, which claims to number as one set.
//
// A claim gets a group only when that is true for everyone who uses it:
// it comes from a template of this pod (no other pod uses it), every
// container that uses it uses all of the group and whole (no request
// filter, which gives a container part of a claim). Anything else keeps
// the per-claim environment, which is right for a claim used alone.
// ours says which resolved claim names are gpulink claims of this pod.
func containerClaimGroups(pod *corev1.Pod, ours map[string]bool) map[string]string {
	resolved := map[string]string{} // pod claim name -> ResourceClaim name
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		if pc.ResourceClaimTemplateName == nil {
			continue
		}
		if n, _, err := resourceclaim.Name(pod, pc); err == nil && n != nil && ours[*n] {
			resolved[pc.Name] = *n
		}
	}
	if len(resolved) < 2 {
		return nil
	}
	sets := map[string][]string{} // claim -> the set of its first container
	broken := map[string]bool{}
	visit := func(ctrs []corev1.Container) {
		for _, ctr := range ctrs {
			var set []string
			filtered := false
			for _, ref := range ctr.Resources.Claims {
				n, ok := resolved[ref.Name]
				if !ok {
					continue
				}
				if ref.Request != "" {
					filtered = true
				}
				if !slices.Contains(set, n) {
					set = append(set, n)
				}
			}
			slices.Sort(set)
			for _, n := range set {
				prev, seen := sets[n]
				switch {
				case filtered || len(set) < 2:
					broken[n] = true
				case seen && !slices.Equal(prev, set):
					broken[n] = true
				}
				sets[n] = set
			}
		}
	}
	visit(pod.Spec.InitContainers)
	visit(pod.Spec.Containers)
	out := map[string]string{}
	for n, set := range sets {
		if broken[n] || slices.ContainsFunc(set, func(m string) bool { return broken[m] }) {
			continue
		}
		out[n] = strings.Join(set, ",")
	}
	return out
}
