package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// unreserve rolls back the allocations a failed decision of an unbound pod
// wrote. A rollback that cannot be written is retried when the pod is
// retried (rollbackStale), before it is decided again.
func (c *Controller) unreserve(ctx context.Context, pod *corev1.Pod, written []*resourceapi.ResourceClaim) error {
	var errs []error
	for _, cl := range written {
		released, err := c.unreserveClaim(ctx, cl)
		if err != nil {
			errs = append(errs, err)
			c.markRollback(pod, cl)
			continue
		}
		if released {
			c.metrics.Released.WithLabelValues(releaseReasonRollback).Inc()
			klog.FromContext(ctx).V(2).Info("Rolled back allocation of a failed decision", "claim", klog.KObj(cl))
		}
	}
	return errors.Join(errs...)
}

// unreserveClaim releases one claim a failed decision wrote (without a
// reservation: see writeDecision), with a fresh read when the copy at hand
// is stale. The claim is released only while it still carries exactly
// that allocation and nobody reserves it. A reservation can only be
// kube-scheduler's, written against the resourceVersion after this
// decision's write: for this pod or another pod sharing the claim, and
// that pod may be bound already, so the allocation is theirs now and
// stays. Every write carries the resourceVersion read, so a reservation
// that lands after the read makes the release conflict and be
// reconsidered, and one that would land after the release fails
// kube-scheduler's binding instead.
func (c *Controller) unreserveClaim(ctx context.Context, cl *resourceapi.ResourceClaim) (bool, error) {
	cur := cl
	for attempt := 0; ; attempt++ {
		if !sameResults(cur.Status.Allocation, cl.Status.Allocation) || len(cur.Status.ReservedFor) > 0 {
			// Deallocated or reallocated by someone else, or reserved
			// by kube-scheduler: nothing of ours to roll back.
			return false, nil
		}
		_, err := c.releaseClaim(ctx, cur, nil)
		if err == nil {
			return true, nil
		}
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if !apierrors.IsConflict(err) || attempt >= 2 {
			return false, err
		}
		fresh, gerr := c.client.ResourceV1().ResourceClaims(cl.Namespace).Get(ctx, cl.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return false, nil
		}
		if gerr != nil {
			return false, fmt.Errorf("re-reading claim %s/%s to roll back its allocation: %w", cl.Namespace, cl.Name, gerr)
		}
		c.claimVersions.saw(fresh)
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

// forgetRollbacks drops the pending rollbacks of a pod that is gone or
// bound (kube-scheduler reserved what it bound the pod with).
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
