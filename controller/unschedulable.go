package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// checkUnschedulable releases the allocation of a pod that kube-scheduler
// could not place on the allocated node: the gate is gone, the pod is not
// bound, PodScheduled is False with reason Unschedulable, and the grace
// period since the allocation has passed. Only claims gpulink allocated
// (they carry its finalizer) that nobody reserves are released; the node
// is then excluded for the pod and it is allocated afresh elsewhere.
//
// A claim kube-scheduler reserved is never released here: it may be
// binding the pod right now (it reserves in PreBind, then binds), and it
// does not write a claim already reserved for the pod it binds, so no
// resourceVersion check would catch a release racing that binding. An
// unreserved claim is safe to release with its resourceVersion: if
// kube-scheduler reserves it first, the release conflicts; if the release
// lands first, kube-scheduler's reservation conflicts and the pod is not
// bound.
func (c *Controller) checkUnschedulable(ctx context.Context, pod *corev1.Pod, pc podClaims) error {
	if pod.Spec.NodeName != "" || !podUnschedulable(pod) {
		return nil
	}
	var release []*resourceapi.ResourceClaim
	var newest time.Time
	node := ""
	for _, ic := range pc.ours {
		cl := ic.Claim
		if !hasFinalizer(cl) || cl.Status.Allocation == nil || len(cl.Status.ReservedFor) > 0 {
			continue
		}
		if ts := cl.Status.Allocation.AllocationTimestamp; ts != nil && ts.After(newest) {
			newest = ts.Time
		}
		node = allocatedNode(cl)
		release = append(release, cl)
	}
	if len(release) == 0 {
		return nil
	}
	if left := c.grace - time.Since(newest); left > 0 {
		c.podQueue.AddAfter(pod.Namespace+"/"+pod.Name, left)
		return nil
	}
	// Confirm with the API server, not the cache, that the pod is still
	// unbound: releasing the claims of a pod being bound would strand it.
	fresh, err := c.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("confirming pod %s/%s is unschedulable: %w", pod.Namespace, pod.Name, err)
	}
	if fresh.UID != pod.UID || fresh.Spec.NodeName != "" || !podUnschedulable(fresh) {
		return nil
	}
	msg := unschedulableMessage(fresh)
	if node != "" {
		// Recorded on the pod before anything is released, so that a
		// restarted controller does not allocate on the node again.
		c.exclude(pod, node)
		if err := c.persistExcluded(ctx, fresh); err != nil {
			return err
		}
	}
	for _, cl := range release {
		if _, err := c.releaseClaim(ctx, cl, nil); err != nil {
			return err
		}
		c.metrics.Released.WithLabelValues(releaseReasonUnschedulable).Inc()
	}
	c.fit.Unassume(pod.UID)
	note := fmt.Sprintf("released allocation on node %s: kube-scheduler could not place the pod there (%s); trying other nodes", node, msg)
	klog.FromContext(ctx).Info("Released allocation of unschedulable pod", "node", node, "reason", msg)
	c.explain.event(pod, release[0], corev1.EventTypeWarning, report.ReasonReleased, actionRelease, note)
	c.podQueue.Add(pod.Namespace + "/" + pod.Name)
	c.enqueueRefusedGang(pod)
	return nil
}

func podUnschedulable(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}

func unschedulableMessage(pod *corev1.Pod) string {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Message != "" {
			return cond.Message
		}
	}
	return "PodScheduled=False, reason Unschedulable"
}

// allocatedNode returns the node an allocation is pinned to by gpulink's
// node selector (or the pool of its first gpulink result).
func allocatedNode(cl *resourceapi.ResourceClaim) string {
	a := cl.Status.Allocation
	if a == nil {
		return ""
	}
	if ns := a.NodeSelector; ns != nil && len(ns.NodeSelectorTerms) == 1 {
		for _, f := range ns.NodeSelectorTerms[0].MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	for _, r := range a.Devices.Results {
		if r.Driver == driver.Name {
			return r.Pool
		}
	}
	return ""
}
