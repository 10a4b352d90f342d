package compat

// The device-plugin resource names the translation takes off pods.

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
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

// QuotaNames sorts the translated names by what a ResourceQuota on them
// counts.
type QuotaNames struct {
	// Devices count GPUs or MIG devices (nvidia.com/gpu, aliyun.com/gpu):
	// a quota on <class>.deviceclass.resource.k8s.io/devices counts the
	// same thing once they are translated.
	Devices []corev1.ResourceName
	// Capacities measure a GPU's memory or cores (nvidia.com/gpumem,
	// gpumem-percentage, gpucores, tencent.com/vcuda-memory, vcuda-core):
	// each maps to the share capacity it becomes (driver.CapacityMemory,
	// driver.CapacityCores). No quota of Kubernetes 1.37 counts a claim's
	// capacity: a class quota counts a share as one device whatever its
	// size.
	Capacities map[corev1.ResourceName]resourceapi.QualifiedName
}

// QuotaNames returns the enabled names by what a quota on them counts;
// MIG names (ResourcePrefixes) count devices too. The task priority counts
// nothing and is in neither.
func (t *Translator) QuotaNames() QuotaNames {
	c := t.Config
	q := QuotaNames{Capacities: map[corev1.ResourceName]resourceapi.QualifiedName{}}
	if c.NVIDIA.Enabled {
		q.Devices = append(q.Devices, corev1.ResourceName(c.NVIDIA.GPU))
		q.Capacities[corev1.ResourceName(c.NVIDIA.Memory)] = driver.CapacityMemory
		q.Capacities[corev1.ResourceName(c.NVIDIA.MemoryPercentage)] = driver.CapacityMemory
		q.Capacities[corev1.ResourceName(c.NVIDIA.Cores)] = driver.CapacityCores
	}
	if c.Aliyun.Enabled {
		q.Devices = append(q.Devices, corev1.ResourceName(c.Aliyun.GPU))
	}
	if c.Tencent.Enabled {
		q.Capacities[corev1.ResourceName(c.Tencent.Memory)] = driver.CapacityMemory
		q.Capacities[corev1.ResourceName(c.Tencent.Cores)] = driver.CapacityCores
	}
	return q
}
