package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
)

// syncClaim cleans up a claim carrying gpulink's finalizer: reservations
// of pods that are gone (or finished) are dropped, a claim nobody reserves
// any more is deallocated, and the finalizer is removed once the claim is
// neither allocated nor reserved. The resourceclaim controller does the
// first two steps only for claims with its own finalizer; this covers
// claims gpulink allocated, including after a controller restart.
func (c *Controller) syncClaim(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	claim, err := c.claims.ResourceClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading claim %s from cache: %w", key, err)
	}
	if c.isHoldRecord(claim) {
		return c.syncHoldRecord(ctx, claim)
	}
	if !hasFinalizer(claim) {
		return nil
	}
	if c.ledger.InFlight(claim.UID) {
		// A decision's write is in flight: its claim update brings the
		// claim back, but a write that fails brings nothing, and a
		// Terminating claim would keep the finalizer until a resync (never
		// with resync 0). Retried with the queue's backoff.
		return fmt.Errorf("claim %s: %w", key, errDecisionInFlight)
	}
	var keep []resourceapi.ResourceClaimConsumerReference
	for _, r := range claim.Status.ReservedFor {
		gone, err := c.consumerGone(ctx, claim.Namespace, r)
		if err != nil {
			return err
		}
		if !gone {
			keep = append(keep, r)
		}
	}
	if len(keep) == len(claim.Status.ReservedFor) && len(keep) > 0 {
		c.forgetUnwanted(claim.UID)
		return nil
	}
	if len(keep) > 0 || (len(claim.Status.ReservedFor) > 0 && claim.DeletionTimestamp == nil && c.claimWanted(claim)) {
		c.forgetUnwanted(claim.UID)
		// Pods still use the claim, or a live pod references it (a
		// shared claim whose reserving pods are all gone while another
		// pod waits to be bound with it): only the reservations of the
		// pods that are gone are dropped, the allocation stays.
		logger.V(2).Info("Removing reservations of pods that are gone", "claim", klog.KObj(claim), "remaining", len(keep))
		_, err := c.keepReservations(ctx, claim, keep)
		return err
	}
	if claim.DeletionTimestamp == nil && len(claim.Status.ReservedFor) == 0 {
		switch {
		case claim.Status.Allocation != nil:
			// Allocated but not reserved: a pod may be about to use it (one
			// created with the claim's name after an earlier pod finished).
			// A pod that references it and still exists keeps it.
			if c.claimWanted(claim) {
				c.forgetUnwanted(claim.UID)
				return nil
			}
		case (c.claimWanted(claim) || c.ownerLive(ctx, claim)) && c.mayAllocate(ctx, claim):
			// Not allocated yet: the finalizer came with the claim (the
			// chart's MutatingAdmissionPolicy adds it at creation, so that
			// allocating takes one claim write), and the controller will
			// allocate it for the pod that uses it.
			return nil
		}
	}
	orphan := claim.Status.Allocation != nil && claim.DeletionTimestamp == nil
	if orphan {
		if wait := c.releaseWait(claim.UID); wait > 0 {
			c.gcQueue.AddAfter(key, wait)
			return nil
		}
		// Marked before the last look for a pod wanting it, so that the
		// pod worker never hands over a pod with the allocation this
		// removes (handover.go).
		c.beginOrphanRelease(claim.UID)
		wanted, err := c.claimWantedLive(ctx, claim)
		if err != nil || wanted {
			c.endOrphanRelease(claim.UID, false)
			if wanted {
				c.forgetUnwanted(claim.UID)
			}
			return err
		}
	}
	logger.Info("Releasing claim no pod uses", "claim", klog.KObj(claim), "allocated", claim.Status.Allocation != nil, "deleting", claim.DeletionTimestamp != nil)
	_, err = c.releaseClaim(ctx, claim, nil)
	if orphan {
		c.endOrphanRelease(claim.UID, err != nil)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if claim.Status.Allocation != nil {
		c.metrics.Released.WithLabelValues(releaseReasonOrphaned).Inc()
	}
	return nil
}

// errDecisionInFlight makes the claim clean-up retry a claim whose
// allocation write is in flight.
var errDecisionInFlight = errors.New("an allocation decision is being written; retrying")

// consumerGone tells whether a reservedFor entry refers to a pod that no
// longer exists (or was replaced, or has finished). The cache answers
// first; a pod missing there is confirmed with a live read, so informer
// lag never releases a claim a new pod holds.
func (c *Controller) consumerGone(ctx context.Context, ns string, r resourceapi.ResourceClaimConsumerReference) (bool, error) {
	if r.Resource != "pods" || r.APIGroup != "" {
		return false, nil
	}
	pod, err := c.pods.Pods(ns).Get(r.Name)
	if err == nil && pod.UID == r.UID {
		return planner.PodDone(pod), nil
	}
	pod, err = c.client.CoreV1().Pods(ns).Get(ctx, r.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("checking pod %s/%s reserved in a claim: %w", ns, r.Name, err)
	}
	return pod.UID != r.UID || planner.PodDone(pod), nil
}

// claimWanted tells whether a live, unfinished pod references the claim,
// or owns it (a claim from a template exists before its pod's status
// names it).
func (c *Controller) claimWanted(claim *resourceapi.ResourceClaim) bool {
	pods, err := c.podsReferencing(claim.Namespace + "/" + claim.Name)
	if err != nil {
		return true
	}
	for _, pod := range pods {
		if podLive(pod) {
			return true
		}
	}
	if o := metav1.GetControllerOf(claim); o != nil && o.Kind == "Pod" && o.APIVersion == "v1" {
		if pod, err := c.pods.Pods(claim.Namespace).Get(o.Name); err == nil && pod.UID == o.UID && podLive(pod) {
			return true
		}
	}
	return false
}

// ownerLive tells whether the pod owning a claim (one created from the
// pod's template) exists and is unfinished, with a live read when the cache
// does not have the pod yet: the claim's informer may be ahead of the pod's.
func (c *Controller) ownerLive(ctx context.Context, claim *resourceapi.ResourceClaim) bool {
	o := metav1.GetControllerOf(claim)
	if o == nil || o.Kind != "Pod" || o.APIVersion != "v1" {
		return false
	}
	pod, err := c.pods.Pods(claim.Namespace).Get(o.Name)
	if err != nil {
		if pod, err = c.client.CoreV1().Pods(claim.Namespace).Get(ctx, o.Name, metav1.GetOptions{}); err != nil {
			// Unknown (not NotFound) keeps the finalizer: removing it
			// would cost the allocation a write, keeping it costs nothing.
			return !apierrors.IsNotFound(err)
		}
	}
	return pod.UID == o.UID && podLive(pod)
}

// podLive tells whether a pod still counts as a user of its claims: not
// being deleted and not finished.
func podLive(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && !planner.PodDone(pod)
}

// mayAllocate tells whether the controller would allocate the claim: all
// its requests are gpulink's (or it cannot tell yet, e.g. a DeviceClass is
// missing). A claim with no gpulink request loses the finalizer the
// admission policy gave it by class name.
func (c *Controller) mayAllocate(ctx context.Context, claim *resourceapi.ResourceClaim) bool {
	_, kind, err := c.interp.Interpret(ctx, claim)
	return err != nil || kind == planner.ClaimOurs
}

// releaseWait returns how much longer an allocated claim that no live pod
// in the cache references must stay so before the clean-up releases it
// (0: release now). The pod informer can be behind the claim informer: a
// pod just created with the claim's name is not in the cache yet, while
// kube-scheduler may already be binding it with that allocation. Its
// PreBind, on a conflict, reads the claim again and reserves whatever the
// claim then holds, so a release followed by a new allocation elsewhere
// could bind the pod to a node its claim is not on. The wait lets the
// cache catch up first.
func (c *Controller) releaseWait(uid types.UID) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	since, ok := c.unwanted[uid]
	if !ok {
		c.unwanted[uid] = now
		return c.releaseGrace
	}
	if left := c.releaseGrace - now.Sub(since); left > 0 {
		return left
	}
	delete(c.unwanted, uid)
	return 0
}

// forgetUnwanted ends the wait of a claim a pod turned out to want (or
// that is gone).
func (c *Controller) forgetUnwanted(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.unwanted, uid)
}
