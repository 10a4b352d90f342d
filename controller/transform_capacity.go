package controller

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/internal/sliceformat"
)

// capacityClassesMax bounds the table of capacity maps. A cluster's
// devices publish a few kinds of capacities (one per GPU model, memory
// size and partition profile, in the tens), so the bound only stops a
// pathological stream of distinct capacities from growing it.
const capacityClassesMax = 4096

// capacityClasses holds one map per distinct set of capacities that
// internSlice has met, by sliceformat.CapacitySignature. Identical GPUs
// publish identical capacities with request policies (share sizes,
// ranges), which decoded once per device took about a tenth of the
// controller's live heap at 5,000 nodes (test/scale's heap profile).
var capacityClasses = struct {
	sync.Mutex
	m map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}{m: map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}

// internCapacity returns the one map held for capacities equal to caps,
// adding a copy of caps (its names interned) while the table has room.
// The map is shared by every cached device that publishes these
// capacities: like the rest of the informer's cache it must never be
// written to.
func internCapacity(caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	sig, ok := sliceformat.CapacitySignature(caps)
	if ok {
		capacityClasses.Lock()
		shared, found := capacityClasses.m[sig]
		capacityClasses.Unlock()
		if found {
			return shared
		}
	}
	own := make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(caps))
	for k, v := range caps {
		own[resourceapi.QualifiedName(intern(string(k)))] = v
	}
	if !ok {
		return own
	}
	capacityClasses.Lock()
	defer capacityClasses.Unlock()
	if shared, found := capacityClasses.m[sig]; found {
		return shared
	}
	if len(capacityClasses.m) < capacityClassesMax {
		capacityClasses.m[sig] = own
	}
	return own
}
