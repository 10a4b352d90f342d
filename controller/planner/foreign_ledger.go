package planner

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
)

// foreignUse is what an allocation result takes from another driver's
// device, for gpulink's choice of such devices (foreign_plan.go): the
// whole device, whether the result is dedicated or a share of it, so
// that gpulink never hands out a device anyone holds (it writes dedicated
// results only). Admin access takes nothing, as for kube-scheduler.
func foreignUse(r *resourceapi.DeviceRequestAllocationResult) (DeviceUse, bool) {
	if r.Driver == driver.Name || r.Driver == "" || (r.AdminAccess != nil && *r.AdminAccess) {
		return DeviceUse{}, false
	}
	return DeviceUse{Key: DeviceKey{Driver: r.Driver, Pool: r.Pool, Device: r.Device}, Exclusive: true}, true
}

// ForeignHeld tells whether a claim holds another driver's device, as the
// informer shows it or as a decision of ours assumed it.
func (l *Ledger) ForeignHeld(k DeviceKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usage[k] != nil
}

// ForeignGeneration is the sum of the hold generations of the pools fn's
// devices are in (0 for nil): it moves whenever one of the node's other
// drivers' devices is held or let go, as Generations does for its GPUs,
// and a new ForeignNode replaces fn whenever those pools change.
func (l *Ledger) ForeignGeneration(fn *ForeignNode) uint64 {
	if fn == nil {
		return 0
	}
	var sum uint64
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range fn.pools {
		sum += l.foreignGen[k]
	}
	return sum
}

// holdsGpulink tells whether uses take any gpulink device: a deleted claim
// of other drivers' devices alone is not gpulink's to keep (KeepForPods).
func holdsGpulink(uses []DeviceUse) bool {
	for _, u := range uses {
		if u.Key.Driver == "" {
			return true
		}
	}
	return false
}
