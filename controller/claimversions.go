package controller

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/planner"
)

// claimVersions remembers, per claim, the newest resourceVersion this
// controller has seen outside its informer: the claim as a release of its
// allocation returned it, or as a live read found it deallocated. Until the
// informer delivers that version, the cached claim still shows the
// allocation that is gone, and a decision made from it would count the
// claim as allocated: a retry after a rolled-back decision would then
// allocate only the pod's other claims and remove the pod's gate with this
// one unallocated, handing kube-scheduler a claim to allocate by its own,
// lagging view of gpulink's devices (the churn test's over-committed share,
// 2026-11-30). The pods using such a claim wait for the informer instead; its
// update brings them back (enqueueClaimPods).
type claimVersions struct {
	mu   sync.Mutex
	seen map[types.UID]string
}

func newClaimVersions() *claimVersions {
	return &claimVersions{seen: map[types.UID]string{}}
}

// saw records the claim as read or written live.
func (v *claimVersions) saw(claim *resourceapi.ResourceClaim) {
	if claim == nil || claim.ResourceVersion == "" {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if old, ok := v.seen[claim.UID]; ok && planner.ResourceVersionAtLeast(old, claim.ResourceVersion) {
		return
	}
	v.seen[claim.UID] = claim.ResourceVersion
}

// behind tells whether the cached claim is older than what was seen live
// (and forgets the record once the cache has caught up).
func (v *claimVersions) behind(cached *resourceapi.ResourceClaim) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	want, ok := v.seen[cached.UID]
	if !ok {
		return false
	}
	if planner.ResourceVersionAtLeast(cached.ResourceVersion, want) {
		delete(v.seen, cached.UID)
		return false
	}
	return true
}

// observe forgets the claim's record once the informer has caught up, so
// that claims no pod comes back for leave nothing behind.
func (v *claimVersions) observe(cached *resourceapi.ResourceClaim) {
	v.behind(cached)
}

// forget drops a deleted claim's record.
func (v *claimVersions) forget(uid types.UID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.seen, uid)
}
