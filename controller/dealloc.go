package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/controller/report"
)

// onDeallocated reacts to an allocation being removed by someone else
// than this controller. When kube-scheduler finds a pod unschedulable on
// the node its claims are allocated on, its DRA plugin deallocates a claim
// that is unreserved or reserved only for that pod, so that it can be
// allocated elsewhere (PostFilter). Allocating on the same node again
// would loop, so the node is excluded for the unbound, ungated pods that
// use the claim: those it was reserved for and those that reference it
// (the controller leaves reserving to kube-scheduler, see writeDecision).
func (c *Controller) onDeallocated(old *resourceapi.ResourceClaim) {
	if c.releasedByUs(old.UID) || !hasFinalizer(old) {
		return
	}
	node := allocatedNode(old)
	if node == "" {
		return
	}
	for _, pod := range c.claimPods(old) {
		// The cached pod may still show the gate this controller removed:
		// the claim's update can arrive before the pod's.
		if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil || !c.handedOver(pod) || c.excludedNodes(pod).Has(node) {
			continue
		}
		c.exclude(pod, node)
		c.fit.Unassume(pod.UID)
		why := "kube-scheduler could not place the pod there and deallocated the claim"
		if podUnschedulable(pod) {
			why += ": " + unschedulableMessage(pod)
		}
		c.explain.event(pod, old, corev1.EventTypeWarning, report.ReasonReleased, actionRelease,
			fmt.Sprintf("allocation on node %s was released (%s); trying other nodes", node, why))
		c.metrics.Released.WithLabelValues(releaseReasonScheduler).Inc()
		c.podQueue.Add(pod.Namespace + "/" + pod.Name)
		c.enqueueRefusedGang(pod)
	}
}

// enqueueRefusedGang queues the pods of a refused pod's gang: one of them
// may be waiting for this pod's allocation to go (replaceWholeGang).
func (c *Controller) enqueueRefusedGang(pod *corev1.Pod) {
	if ref, ok := c.gangOf(pod); ok {
		c.enqueueGang(ref.Key())
	}
}

// claimPods returns the pods in the cache that the claim is reserved for
// or that reference it, once each.
func (c *Controller) claimPods(claim *resourceapi.ResourceClaim) []*corev1.Pod {
	var out []*corev1.Pod
	seen := sets.New[types.UID]()
	for _, r := range claim.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		if pod, err := c.pods.Pods(claim.Namespace).Get(r.Name); err == nil && pod.UID == r.UID && !seen.Has(pod.UID) {
			seen.Insert(pod.UID)
			out = append(out, pod)
		}
	}
	pods, err := c.podsReferencing(claim.Namespace + "/" + claim.Name)
	if err != nil {
		return out
	}
	for _, pod := range pods {
		if !seen.Has(pod.UID) {
			seen.Insert(pod.UID)
			out = append(out, pod)
		}
	}
	return out
}

// markReleasing records that this controller is about to remove the
// claim's allocation (done false: the write failed, forget it).
func (c *Controller) markReleasing(uid types.UID, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if done {
		c.releasing.Insert(uid)
	} else {
		c.releasing.Delete(uid)
	}
}

// releasedByUs tells (once) whether this controller removed the claim's
// allocation.
func (c *Controller) releasedByUs(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.releasing.Has(uid) {
		return false
	}
	c.releasing.Delete(uid)
	return true
}
