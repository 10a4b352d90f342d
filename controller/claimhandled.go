package controller

import (
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/planner"
)

// handledClaims remembers, per claim, the version the claim event
// handlers last reacted to and whether it was allocated. An informer
// updates its cache before it calls the handlers, from a goroutine of
// its own, so a worker reading the cache in between can see a change the
// handlers have not reacted to yet. For a deallocation that matters:
// onDeallocated excludes the node kube-scheduler refused the pod on, and
// a pod decided again before that goes back to the same node, to be
// refused there once more (TestGangPodRefusedAfterUngating failed so
// once in a full run of the suite, 2026-11-30). The pods of a claim whose
// deallocation is not handled yet wait; the handler queues them once it
// is (onClaimUpdate).
type handledClaims struct {
	mu      sync.Mutex
	byClaim map[types.UID]handledClaim
}

type handledClaim struct {
	resourceVersion string
	allocated       bool
}

func newHandledClaims() *handledClaims {
	return &handledClaims{byClaim: map[types.UID]handledClaim{}}
}

// handled records the claim's version as reacted to.
func (h *handledClaims) handled(claim *resourceapi.ResourceClaim) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byClaim[claim.UID] = handledClaim{resourceVersion: claim.ResourceVersion, allocated: claim.Status.Allocation != nil}
}

// deallocationPending tells whether the cached claim shows its allocation
// gone in a version newer than the handlers last reacted to, when that
// one was allocated. A claim the handlers never saw does not wait.
func (h *handledClaims) deallocationPending(cached *resourceapi.ResourceClaim) bool {
	if cached.Status.Allocation != nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	last, ok := h.byClaim[cached.UID]
	return ok && last.allocated && !planner.ResourceVersionAtLeast(last.resourceVersion, cached.ResourceVersion)
}

// forget drops a deleted claim's record.
func (h *handledClaims) forget(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.byClaim, uid)
}
