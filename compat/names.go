package compat

// The device-plugin resource names the translation takes off pods.

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ResourceNames returns the extended resource names the translation takes
// off pods (those of the enabled families), besides those starting with
// one of ResourcePrefixes.
func (t *Translator) ResourceNames() []corev1.ResourceName {
	return t.names()
}

// ResourcePrefixes returns the prefixes of the resource names the
// translation takes off pods: the MIG resources' (nvidia.com/mig-), when on.
func (t *Translator) ResourcePrefixes() []string {
	if t.Config.NVIDIA.Enabled && t.Config.NVIDIA.MIG {
		return []string{t.Config.NVIDIA.MIGPrefix}
	}
	return nil
}

// isMIGName tells whether a resource name is a MIG resource the
// translation takes.
func (t *Translator) isMIGName(n corev1.ResourceName) bool {
	for _, p := range t.ResourcePrefixes() {
		if strings.HasPrefix(string(n), p) {
			return true
		}
	}
	return false
}

// names returns the enabled resource names.
func (t *Translator) names() []corev1.ResourceName {
	c := t.Config
	var n []string
	if c.NVIDIA.Enabled {
		n = append(n, c.NVIDIA.GPU, c.NVIDIA.Memory, c.NVIDIA.MemoryPercentage, c.NVIDIA.Cores, c.NVIDIA.Priority)
	}
	if c.Aliyun.Enabled {
		n = append(n, c.Aliyun.GPU)
	}
	if c.Tencent.Enabled {
		n = append(n, c.Tencent.Cores, c.Tencent.Memory)
	}
	out := make([]corev1.ResourceName, len(n))
	for i, s := range n {
		out[i] = corev1.ResourceName(s)
	}
	return out
}

func (t *Translator) usesAny(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, n := range t.names() {
				if _, ok := cs[i].Resources.Limits[n]; ok {
					return true
				}
				if _, ok := cs[i].Resources.Requests[n]; ok {
					return true
				}
			}
			for _, l := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for n := range l {
					if t.isMIGName(n) {
						return true
					}
				}
			}
		}
	}
	return false
}

func (t *Translator) strip(r *corev1.ResourceRequirements) {
	for _, n := range t.names() {
		delete(r.Limits, n)
		delete(r.Requests, n)
	}
	for _, l := range []corev1.ResourceList{r.Limits, r.Requests} {
		for n := range l {
			if t.isMIGName(n) {
				delete(l, n)
			}
		}
	}
	if len(r.Limits) == 0 {
		r.Limits = nil
	}
	if len(r.Requests) == 0 {
		r.Requests = nil
	}
}
