package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
)

// writeGang writes the claims of every pod of a gang decision, pod by pod,
// before any gate is removed: until the last write succeeds no pod of the
// gang can reach kube-scheduler, so a failure, a restart or a failover in
// between leaves only gated pods with allocated claims, which recoverGang
// rolls back (or completes, when every pod was written). When a write
// fails, the claims already written for this decision, of every pod, are
// rolled back as for a multi-claim pod (unreserve), and the assumptions
// not written are dropped.
func (c *Controller) writeGang(ctx context.Context, spec gangs.Spec, dec *gangDecision) error {
	type written struct {
		pod    *corev1.Pod
		claims []*resourceapi.ResourceClaim
	}
	var done []written
	for i, pw := range dec.pods {
		claims, err := c.writeClaims(ctx, pw.m.pod, pw.writes)
		if err == nil {
			done = append(done, written{pod: pw.m.pod, claims: claims})
			continue
		}
		// writeClaims rolled back this pod's own claims and dropped its
		// unwritten assumptions; the later pods' were never written.
		c.fit.Unassume(pw.m.pod.UID)
		for _, rest := range dec.pods[i+1:] {
			for _, w := range rest.writes {
				w.settle("", false)
			}
			c.fit.Unassume(rest.m.pod.UID)
		}
		errs := []error{fmt.Errorf("%s: writing the claims of pod %s: %w", spec.Ref, pw.m.pod.Name, err)}
		for _, d := range done {
			if rbErr := c.unreserve(ctx, d.pod, d.claims); rbErr != nil {
				errs = append(errs, rbErr)
			}
			c.fit.Unassume(d.pod.UID)
		}
		klog.FromContext(ctx).Info("Gang decision rolled back: a write failed", "failedPod", pw.m.pod.Name, "rolledBackPods", len(done), "err", err)
		return errors.Join(errs...)
	}
	return nil
}

// recoverGang settles a decision an earlier run left between its writes
// and the gates' removal (a restart or failover of the controller; the
// ledger's in-flight check keeps this run's own decisions out): when at
// least minCount pods of the gang run or have all their gpulink claims
// allocated, the decision was complete and the allocated pods are
// ungated; otherwise every gpulink claim allocated to a gated pod of the
// gang and reserved for it alone is released, so that no gang waits
// holding part of its devices. It reports whether it acted.
func (c *Controller) recoverGang(ctx context.Context, spec gangs.Spec, members []*gangMember) (bool, error) {
	var partial []*gangMember
	complete := 0
	for _, m := range members {
		switch {
		case !m.gated():
			complete++
		case len(m.allocated) > 0:
			partial = append(partial, m)
			if len(m.pending) == 0 && m.ready() {
				complete++
			}
		}
	}
	if len(partial) == 0 {
		return false, nil
	}
	logger := klog.FromContext(ctx)
	var errs []error
	if complete >= spec.MinCount {
		ungated := 0
		for _, m := range partial {
			if len(m.pending) > 0 || !m.ready() {
				continue
			}
			if err := c.handOver(ctx, m.pod, m.allocatedClaims()); err != nil {
				errs = append(errs, err)
				continue
			}
			ungated++
			logger.Info("Removed scheduling gate of a gang pod whose decision was complete", "pod", klog.KObj(m.pod))
		}
		// A partly allocated pod beyond minCount is completed as a
		// singleton on the node its allocated claims pin (syncSingle).
		return ungated > 0 || len(errs) > 0, errors.Join(errs...)
	}
	released := 0
	for _, m := range partial {
		for _, ic := range m.allocated {
			cl := ic.Claim
			if !hasFinalizer(cl) || !reservedAtMostFor(cl, m.pod) || c.otherPodUses(cl, m.pod) {
				// Shared with another pod, or not written by a gang
				// decision of ours: not ours to release.
				continue
			}
			if _, err := c.releaseClaim(ctx, cl, nil); err != nil {
				errs = append(errs, err)
				continue
			}
			c.metrics.Released.WithLabelValues(releaseReasonGangRollback).Inc()
			released++
		}
		c.fit.Unassume(m.pod.UID)
	}
	if released > 0 {
		msg := fmt.Sprintf("%s: released %d claim(s) of a decision that was interrupted before all %d pods were allocated (%d were): a gang never waits holding part of its devices",
			spec.Ref, released, spec.MinCount, complete)
		logger.Info("Rolled back an interrupted gang decision", "released", released, "complete", complete, "minCount", spec.MinCount)
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonGangRolledBack, actionRelease, msg)
	}
	// The claims' updates bring the pods back to a decision.
	return true, errors.Join(errs...)
}

// reservedAtMostFor tells whether a claim is reserved for nobody or for
// the gated pod alone. The controller writes no reservation for a pod it
// has not seen bound (writeDecision), and kube-scheduler cannot reserve a
// claim for a gated pod, so either is what a gang decision of ours left;
// a reservation for the pod alone is what a controller before that change
// wrote.
func reservedAtMostFor(cl *resourceapi.ResourceClaim, pod *corev1.Pod) bool {
	switch len(cl.Status.ReservedFor) {
	case 0:
		return true
	case 1:
		return cl.Status.ReservedFor[0].UID == pod.UID
	}
	return false
}

// otherPodUses tells whether a pod other than pod references the claim in
// the pod cache: its allocation is then that pod's too.
func (c *Controller) otherPodUses(cl *resourceapi.ResourceClaim, pod *corev1.Pod) bool {
	pods, err := c.podsReferencing(cl.Namespace + "/" + cl.Name)
	if err != nil {
		return true
	}
	return slices.ContainsFunc(pods, func(other *corev1.Pod) bool { return other.UID != pod.UID })
}
