package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A standalone claim that stays allocated after its last pod went is
// released by the clean-up (gc.go) once no live pod wants it, while a new
// pod naming it may be on its way: the pod worker hands such a pod to
// kube-scheduler as soon as the claim is allocated. Were the release to
// land after that hand-over, kube-scheduler, binding from its own view of
// the claim, would reserve whatever the claim holds by then (its PreBind
// reads the claim again on a conflict and only appends the reservation)
// and bind the pod to the node of the old allocation: a bound pod whose
// claim is allocated elsewhere (the churn test's "pod f0138-shared bound
// to fault-v100 but its claim shared-one-1 is allocated on fault-a100",
// 2026-12-01). The two sides are ordered here:
//
//   - the clean-up marks the claim (beginOrphanRelease) before it looks
//     for pods wanting it, in the cache and then with a live list of the
//     namespace's pods, and keeps the mark until its write has returned;
//   - the pod worker, which read the pod from the cache before, hands it
//     over only when no already-allocated claim of it is marked, released
//     as far as this controller knows, or unallocated in the cache.
//
// Either the pod worker checks first, and then the pod is in the cache the
// clean-up reads after marking, so the claim is kept; or the clean-up marks
// first, and then the pod worker waits for the release and allocates the
// claim for the pod like any other.

// errClaimBeingReleased makes the pod worker retry a pod whose allocated
// claim the clean-up is releasing, or has just released.
var errClaimBeingReleased = errors.New("an allocated claim of the pod is being released as unused; retrying")

// beginOrphanRelease marks a claim the clean-up is about to release as no
// pod's.
func (c *Controller) beginOrphanRelease(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.orphanReleases[uid] = time.Time{}
}

// endOrphanRelease drops the mark once the release's writes have returned
// (claimVersions then tells a cache that does not show them yet). A write
// that failed may still have landed (a timeout after the API server applied
// it), and then nothing tells the cache is behind: the mark stays for the
// release grace, time enough for the informer to deliver the write.
func (c *Controller) endOrphanRelease(uid types.UID, failed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if failed {
		c.orphanReleases[uid] = time.Now().Add(c.releaseGrace)
		return
	}
	delete(c.orphanReleases, uid)
}

func (c *Controller) orphanReleasing(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.orphanReleases[uid]
	if ok && !until.IsZero() && time.Now().After(until) {
		delete(c.orphanReleases, uid)
		return false
	}
	return ok
}

// claimWantedLive is claimWanted confirmed with a live list of the
// namespace's pods when the cache shows none: a pod created just now may
// not be in the cache yet. Only standalone claims whose last pod went come
// here, so the list is rare.
func (c *Controller) claimWantedLive(ctx context.Context, claim *resourceapi.ResourceClaim) (bool, error) {
	if c.claimWanted(claim) {
		return true, nil
	}
	pods, err := c.client.CoreV1().Pods(claim.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, fmt.Errorf("listing pods of namespace %s to confirm that none uses claim %s before releasing it: %w", claim.Namespace, claim.Name, err)
	}
	key := claim.Namespace + "/" + claim.Name
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !podLive(pod) {
			continue
		}
		keys, _ := indexPodClaims(pod)
		if slices.Contains(keys, key) {
			return true, nil
		}
	}
	return false, nil
}

// handOver removes the pod's gate, unless one of the claims the decision
// found allocated (kept) is being released or was released since
// (errClaimBeingReleased: the pod is retried and its claim allocated
// again).
func (c *Controller) handOver(ctx context.Context, pod *corev1.Pod, kept []*resourceapi.ResourceClaim) error {
	if err := c.keptClaimsHeld(kept); err != nil {
		return fmt.Errorf("pod %s/%s keeps its scheduling gate: %w", pod.Namespace, pod.Name, err)
	}
	return c.ungate(ctx, pod)
}

// keptClaimsHeld checks that claims a decision took as allocated still
// are. Only claims with gpulink's finalizer are released by the clean-up.
func (c *Controller) keptClaimsHeld(kept []*resourceapi.ResourceClaim) error {
	for _, used := range kept {
		if used.Status.Allocation == nil || !hasFinalizer(used) {
			continue
		}
		if c.orphanReleasing(used.UID) {
			return fmt.Errorf("claim %s/%s: %w", used.Namespace, used.Name, errClaimBeingReleased)
		}
		cached, err := c.claims.ResourceClaims(used.Namespace).Get(used.Name)
		switch {
		case err != nil || cached.UID != used.UID:
			return fmt.Errorf("claim %s/%s was deleted or replaced since the decision: %w", used.Namespace, used.Name, errClaimBeingReleased)
		case c.claimVersions.behind(cached) || cached.Status.Allocation == nil:
			return fmt.Errorf("claim %s/%s: %w", used.Namespace, used.Name, errClaimBeingReleased)
		}
	}
	return nil
}
