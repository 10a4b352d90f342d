package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
)

// pendingWrite is one claim of a decision: the allocation to write and
// the ledger assumption to settle.
type pendingWrite struct {
	ic     *planner.Claim
	alloc  *resourceapi.AllocationResult
	settle func(string, bool)
}

// writeDecision writes the claims of one decision in order. When a write
// fails, the claims this decision already wrote are rolled back, as
// kube-scheduler's Unreserve does: a pod must never keep part of its
// devices while it waits for the rest, because the devices it holds can
// be what another pod (or its own retry on another node) needs.
func (c *Controller) writeDecision(ctx context.Context, pod *corev1.Pod, writes []pendingWrite) error {
	_, err := c.writeClaims(ctx, pod, writes)
	return err
}

// writeClaims is writeDecision returning the claims written, for a gang's
// decision to roll back when a later pod's write fails.
func (c *Controller) writeClaims(ctx context.Context, pod *corev1.Pod, writes []pendingWrite) ([]*resourceapi.ResourceClaim, error) {
	consumer := resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID}
	var written []*resourceapi.ResourceClaim
	ours := map[string]bool{}
	for _, w := range writes {
		ours[w.ic.Claim.Name] = true
	}
	groups := containerClaimGroups(pod, ours)
	for i, w := range writes {
		updated, err := c.writeAllocation(ctx, w.ic.Claim, w.alloc, consumer, groups[w.ic.Claim.Name])
		if err != nil {
			rest := writes[i+1:]
			if fresh := c.writtenAnyway(ctx, w, err); fresh != nil {
				// The write happened although the call failed: count
				// it, and roll it back with the others.
				w.settle(fresh.ResourceVersion, true)
				written = append(written, fresh)
			} else {
				w.settle("", false)
			}
			for _, r := range rest {
				r.settle("", false)
			}
			reason := errReasonAPI
			if apierrors.IsConflict(err) {
				reason = errReasonConflict
			}
			c.metrics.Errors.WithLabelValues(reason).Inc()
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				c.explain.event(pod, w.ic.Claim, corev1.EventTypeWarning, report.ReasonAllocateFailed, actionAllocate, err.Error())
			}
			if rbErr := c.unreserve(ctx, pod, written); rbErr != nil {
				err = errors.Join(err, rbErr)
			}
			// Pods sharing these claims waited for this decision.
			for _, r := range writes[i:] {
				c.enqueueClaimPods(r.ic.Claim)
			}
			return nil, err
		}
		w.settle(updated.ResourceVersion, true)
		written = append(written, updated)
	}
	return written, nil
}

// writtenAnyway tells whether a failed allocation write took effect: a
// timeout or a broken connection says nothing about whether the API
// server applied it. Dropping the assumption of a write that was applied
// would make its devices look free until the informer shows it, and
// leave it out of the rollback. A live read settles it; an API status
// error (429, conflict, invalid...) is a definite refusal.
func (c *Controller) writtenAnyway(ctx context.Context, w pendingWrite, err error) *resourceapi.ResourceClaim {
	var status apierrors.APIStatus
	if errors.As(err, &status) || ctx.Err() != nil {
		return nil
	}
	fresh, gerr := c.client.ResourceV1().ResourceClaims(w.ic.Claim.Namespace).Get(ctx, w.ic.Claim.Name, metav1.GetOptions{})
	if gerr != nil || fresh.UID != w.ic.Claim.UID || fresh.Status.Allocation == nil {
		return nil
	}
	if !sameResults(fresh.Status.Allocation, w.alloc) {
		return nil
	}
	return fresh
}

// unreserve rolls back the allocations a failed decision wrote. A claim is
// released only while it still carries exactly what this decision wrote;
// reservations other pods added meanwhile are kept, and then so is the
// allocation they use. A rollback that cannot be written is retried when
// the pod is retried: the pod is still gated, its claims are reserved for
// it alone, so rollbackStale finds them.
func (c *Controller) unreserve(ctx context.Context, pod *corev1.Pod, written []*resourceapi.ResourceClaim) error {
	var errs []error
	for _, cl := range written {
		if err := c.unreserveClaim(ctx, pod, cl); err != nil {
			errs = append(errs, err)
			c.markRollback(pod, cl)
			continue
		}
		c.metrics.Released.WithLabelValues("rollback").Inc()
		klog.FromContext(ctx).V(2).Info("Rolled back allocation of a failed decision", "claim", klog.KObj(cl))
	}
	return errors.Join(errs...)
}

// unreserveClaim releases one claim written by this pod's decision, with a
// fresh read when the copy at hand is stale.
func (c *Controller) unreserveClaim(ctx context.Context, pod *corev1.Pod, cl *resourceapi.ResourceClaim) error {
	cur := cl
	for attempt := 0; ; attempt++ {
		keep := slices.DeleteFunc(slices.Clone(cur.Status.ReservedFor), func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID })
		if !sameResults(cur.Status.Allocation, cl.Status.Allocation) {
			// Deallocated or reallocated by someone else: nothing of ours.
			return nil
		}
		_, err := c.releaseClaim(ctx, cur, keep)
		if err == nil || !apierrors.IsConflict(err) || attempt >= 2 {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		fresh, gerr := c.client.ResourceV1().ResourceClaims(cl.Namespace).Get(ctx, cl.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return nil
		}
		if gerr != nil {
			return fmt.Errorf("re-reading claim %s/%s to roll back its allocation: %w", cl.Namespace, cl.Name, gerr)
		}
		cur = fresh
	}
}

// markRollback remembers a claim whose rollback could not be written.
func (c *Controller) markRollback(pod *corev1.Pod, cl *resourceapi.ResourceClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rollbacks == nil {
		c.rollbacks = map[types.UID][]*resourceapi.ResourceClaim{}
	}
	c.rollbacks[pod.UID] = append(c.rollbacks[pod.UID], cl)
}

// forgetRollbacks drops the pending rollbacks of a pod that is gone.
func (c *Controller) forgetRollbacks(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.rollbacks, uid)
}

// rollbackStale finishes the rollbacks of an earlier failed decision of
// the pod before it is decided again; it returns an error (and the pod is
// retried) while any of them still cannot be written, so a pod never
// waits holding part of its devices.
func (c *Controller) rollbackStale(ctx context.Context, pod *corev1.Pod) (bool, error) {
	c.mu.Lock()
	todo := c.rollbacks[pod.UID]
	delete(c.rollbacks, pod.UID)
	c.mu.Unlock()
	if len(todo) == 0 {
		return false, nil
	}
	return true, c.unreserve(ctx, pod, todo)
}

// sameResults tells whether two allocations give out the same devices
// (shares by their unique shareID); timestamps may differ in precision
// after a round trip through the API server.
func sameResults(a, b *resourceapi.AllocationResult) bool {
	if a == nil || b == nil || len(a.Devices.Results) != len(b.Devices.Results) {
		return false
	}
	for i := range a.Devices.Results {
		x, y := &a.Devices.Results[i], &b.Devices.Results[i]
		if x.Request != y.Request || x.Driver != y.Driver || x.Pool != y.Pool || x.Device != y.Device || (x.ShareID == nil) != (y.ShareID == nil) || (x.ShareID != nil && *x.ShareID != *y.ShareID) {
			return false
		}
	}
	return true
}
