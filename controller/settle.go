package controller

import (
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/planner"
)

// A claim this controller releases on purpose (the rollback of a failed
// decision, the release of a pod kube-scheduler found unschedulable) may
// be in the hands of kube-scheduler at that moment: a pod that references
// it and whose gate is gone can be in its binding cycle. Its PreBind,
// when the reservation it writes conflicts, reads the claim again and
// appends the reservation to whatever allocation the claim then holds
// (retry.DefaultRetry: five tries 10 ms apart), and binds the pod to the
// node it chose from the old allocation. Had the controller allocated the
// claim again on another node in between, the pod would be bound to one
// node with its claim allocated on another, which the kubelet plugin
// refuses for good.
//
// So a claim released while such a pod referenced it is not allocated
// again until releaseSettle has passed: kube-scheduler's re-read then
// finds it unallocated, and the API server refuses a reservation without
// an allocation, so the binding fails and the pod comes back to the
// queue. The settle time is two orders of magnitude above the retries'
// 40 ms; only a PreBind whose re-read is delayed longer than that by the
// API server can still see the new allocation.
const releaseSettle = 2 * time.Second

// releaseSettles holds, per claim, until when it must not be allocated
// again.
type releaseSettles struct {
	mu    sync.Mutex
	until map[types.UID]time.Time
	// settle: releaseSettle (tests shorten it).
	settle time.Duration
	now    func() time.Time
}

func newReleaseSettles() *releaseSettles {
	return &releaseSettles{until: map[types.UID]time.Time{}, settle: releaseSettle, now: time.Now}
}

func (s *releaseSettles) mark(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.until[uid] = s.now().Add(s.settle)
}

// left is how long the claim must still wait (0: free to allocate); an
// expired record is dropped.
func (s *releaseSettles) left(uid types.UID) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.until[uid]
	if !ok {
		return 0
	}
	d := until.Sub(s.now())
	if d <= 0 {
		delete(s.until, uid)
		return 0
	}
	return d
}

func (s *releaseSettles) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.until, uid)
}

// settleIfHandedOver marks a claim whose allocation this controller is
// removing when a live, unbound pod that kube-scheduler holds (its gate
// removed) reserves or references it. Pods still gated cannot be in a
// binding cycle, so their claims are allocated again at once.
func (c *Controller) settleIfHandedOver(claim *resourceapi.ResourceClaim) {
	for _, pod := range c.claimPods(claim) {
		if podLive(pod) && pod.Spec.NodeName == "" && c.handedOver(pod) {
			c.settles.mark(claim.UID)
			return
		}
	}
}

// settlingClaim returns the longest wait among the unallocated claims
// given, and the first claim that imposes it.
func (c *Controller) settlingClaim(claims []*planner.Claim) (time.Duration, *resourceapi.ResourceClaim) {
	var longest time.Duration
	var which *resourceapi.ResourceClaim
	for _, ic := range claims {
		if ic.Claim.Status.Allocation != nil {
			continue
		}
		if d := c.settles.left(ic.Claim.UID); d > longest {
			longest, which = d, ic.Claim
		}
	}
	return longest, which
}
