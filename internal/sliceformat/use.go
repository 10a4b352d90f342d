package sliceformat

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
)

// Use is what one allocation result takes from a published device: all of
// it (Exclusive) or a share of its memory and cores, as the result's
// consumed capacities (the capacities Encode publishes) say.
type Use struct {
	Pool, Device string
	Exclusive    bool
	MemoryBytes  int64
	Cores        int64
}

// ResultUse reads what an allocation result takes from a gpulink device;
// false for other drivers' results and admin access, which take nothing.
func ResultUse(r *resourceapi.DeviceRequestAllocationResult) (Use, bool) {
	if r.Driver != driver.Name || (r.AdminAccess != nil && *r.AdminAccess) {
		return Use{}, false
	}
	u := Use{Pool: r.Pool, Device: r.Device, Exclusive: r.ShareID == nil}
	if !u.Exclusive {
		for name, q := range r.ConsumedCapacity {
			switch qualify(string(name)) {
			case capacityMemory:
				u.MemoryBytes = q.Value()
			case capacityCores:
				u.Cores = q.Value()
			}
		}
	}
	return u, true
}

var (
	capacityMemory = qualify(driver.CapacityMemory)
	capacityCores  = qualify(driver.CapacityCores)
)

// SchedulingTaints are the device's taints that keep work off it unless
// tolerated (NoSchedule, NoExecute), leaving out gpulink's managed taint,
// which only steers requests to the controller.
func SchedulingTaints(taints []resourceapi.DeviceTaint) []resourceapi.DeviceTaint {
	var out []resourceapi.DeviceTaint
	for _, t := range taints {
		if t.Key == driver.ManagedTaintKey && t.Effect == resourceapi.DeviceTaintEffectNoSchedule {
			continue
		}
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			out = append(out, t)
		}
	}
	return out
}
