package controller

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// writeDecision writes the claims of one decision in order.
//
// A write the client saw fail although the API server applied it (a
// timeout, a lost response: writtenAnyway) is a write that landed; a
// decision whose writes all landed is complete and is never rolled back.
//
// The controller reserves a claim for the pod (reservedFor) only when the
// pod is already bound: kube-scheduler, which binds every other pod, skips
// writing a claim already reserved for the pod it binds, so a reservation
// written here would let it bind the pod without any resourceVersion check
// that a concurrent rollback or release could trip. Left to
// kube-scheduler's PreBind, the reservation is written against the
// claim's resourceVersion: whichever of it and a release comes second
// conflicts, and a claim reserved by it is never released here (see
// unreserveClaim, checkUnschedulable).
//
// When a write definitely fails, the claims this decision already wrote
// are rolled back, as kube-scheduler's Unreserve does: an unbound pod must
// never keep part of its devices while it waits for the rest, because the
// devices it holds can be what another pod (or its own retry on another
// node) needs. A bound pod keeps them: it is on that node for good, and
// its retry allocates the rest there.
func (c *Controller) writeDecision(ctx context.Context, pod *corev1.Pod, writes []pendingWrite) error {
	_, err := c.writeClaims(ctx, pod, writes)
	return err
}

// writeClaims is writeDecision returning the claims written, for a gang's
// decision to roll back when a later pod's write fails.
func (c *Controller) writeClaims(ctx context.Context, pod *corev1.Pod, writes []pendingWrite) ([]*resourceapi.ResourceClaim, error) {
	var consumer *resourceapi.ResourceClaimConsumerReference
	if pod.Spec.NodeName != "" {
		consumer = &resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID}
	}
	var written []*resourceapi.ResourceClaim
	ours := map[string]bool{}
	for _, w := range writes {
		ours[w.ic.Claim.Name] = true
	}
	groups := containerClaimGroups(pod, ours)
	for i, w := range writes {
		updated, err := c.writeAllocation(ctx, w.ic.Claim, w.alloc, consumer, groups[w.ic.Claim.Name])
		if err != nil {
			fresh := c.writtenAnyway(ctx, w, err)
			if fresh == nil {
				return nil, c.failDecision(ctx, pod, writes[i:], written, err)
			}
			klog.FromContext(ctx).V(2).Info("Allocation write reported an error but was applied; counted as written", "claim", klog.KObj(w.ic.Claim), "err", err)
			updated = fresh
		}
		w.settle(updated.ResourceVersion, true)
		written = append(written, updated)
	}
	return written, nil
}

// failDecision ends a decision whose write of failed[0] failed: the
// assumptions not written are dropped, the claims written are rolled back
// (unless the pod is bound), and the pods sharing these claims, which
// waited for this decision, are queued again.
func (c *Controller) failDecision(ctx context.Context, pod *corev1.Pod, failed []pendingWrite, written []*resourceapi.ResourceClaim, err error) error {
	for _, r := range failed {
		r.settle("", false)
	}
	reason := errReasonAPI
	if apierrors.IsConflict(err) {
		reason = errReasonConflict
	}
	c.metrics.Errors.WithLabelValues(reason).Inc()
	if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		c.explain.event(pod, failed[0].ic.Claim, corev1.EventTypeWarning, report.ReasonAllocateFailed, actionAllocate, err.Error())
	}
	if pod.Spec.NodeName == "" {
		if rbErr := c.unreserve(ctx, pod, written); rbErr != nil {
			err = errors.Join(err, rbErr)
		}
	}
	for _, r := range failed {
		c.enqueueClaimPods(r.ic.Claim)
	}
	return err
}

// writtenAnyway tells whether a failed allocation write took effect: a
// timeout or a broken connection says nothing about whether the API
// server applied it. A live read settles it; an API status error (429,
// conflict, invalid...) is a definite refusal. It returns the claim as
// written, or nil when the write did not land or cannot be told (the
// read failed too): such a claim is left to the informer, and the pod's
// retry sees it allocated or not.
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
