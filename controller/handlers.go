package controller

// The informers' event handlers: what each change of a pod, claim, slice,
// DeviceClass or Node queues, and the waiting set they re-queue.

import (
	"errors"
	"maps"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// podsReferencing returns the pods in the cache that use the claim
// namespace/name (pod.spec.resourceClaims), through podClaimIndex.
func (c *Controller) podsReferencing(key string) ([]*corev1.Pod, error) {
	objs, err := c.podIdx.ByIndex(podClaimIndex, key)
	if err != nil {
		return nil, err
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			pods = append(pods, pod)
		}
	}
	return pods, nil
}

// indexPodClaims returns namespace/name of every claim a pod uses.
func indexPodClaims(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	// PodClaims yields claims named directly (resourceClaimName) as well
	// as those created from templates.
	for name := range resourceclaim.PodClaims(pod) {
		keys = append(keys, pod.Namespace+"/"+name)
	}
	return keys, nil
}

func (c *Controller) onPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	// Every pod counts for the node fit, GPU pods or not.
	c.fit.Observe(pod)
	c.hostPodObserved(pod)
	if len(pod.Spec.ResourceClaims) == 0 && gateIndex(pod) < 0 {
		return
	}
	if planner.PodDone(pod) {
		// A finished pod's reservations are dropped now, not at the next
		// resync or when the pod is deleted.
		c.enqueuePodClaimsGC(pod)
		c.podEndedForHolds(pod)
	}
	c.podQueue.Add(pod.Namespace + "/" + pod.Name)
}

// enqueuePodClaimsGC queues the claims of a pod that is gone or finished
// for cleanup, and the other pods using them: a pod kept gated by the
// users of a shared MPS claim (mpsusers.go) may go now, and without a
// reservation of the pod to drop no claim update would tell it.
func (c *Controller) enqueuePodClaimsGC(pod *corev1.Pod) {
	for name := range resourceclaim.PodClaims(pod) {
		key := pod.Namespace + "/" + name
		c.gcQueue.Add(key)
		objs, err := c.podIdx.ByIndex(podClaimIndex, key)
		if err != nil {
			continue
		}
		for _, o := range objs {
			if other, ok := o.(*corev1.Pod); ok && other.UID != pod.UID {
				c.podQueue.Add(other.Namespace + "/" + other.Name)
			}
		}
	}
}

func (c *Controller) onPodDelete(obj any) {
	pod, ok := deletedObject[*corev1.Pod](obj)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	c.fit.Forget(pod.UID)
	c.ungating.done(pod.UID)
	c.explain.forget(pod.UID)
	c.forgetBoundElsewhere(pod)
	c.mu.Lock()
	delete(c.excluded, pod.UID)
	delete(c.rollbacks, pod.UID)
	c.decided.Delete(pod.UID)
	c.waiting.Delete(key)
	c.metrics.PendingPods.Set(float64(c.waiting.Len()))
	c.mu.Unlock()
	c.enqueuePodClaimsGC(pod)
	c.podEndedForHolds(pod)
	c.podQueue.Add(key)
	if ref, ok := c.gangOf(pod); ok {
		// The gang shrank: its waiting pods say so, and a reservation
		// of a gang with no pod left waiting ends.
		c.enqueueGang(ref.Key())
		c.checkReservation()
	}
}

func (c *Controller) onClaim(obj any) {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	if c.isHoldRecord(claim) {
		uses, kept := recordUses(claim)
		c.ledger.ObserveRecord(claim, uses, kept)
		c.gcQueue.Add(claim.Namespace + "/" + claim.Name)
		return
	}
	c.ledger.Observe(claim)
	c.claimVersions.observe(claim)
	// Before the claim's pods are queued: they wait while it is not
	// recorded (handledClaims).
	c.handledClaims.handled(claim)
	c.enqueueClaimPods(claim)
	if hasFinalizer(claim) {
		c.gcQueue.Add(claim.Namespace + "/" + claim.Name)
	}
}

func (c *Controller) onClaimUpdate(oldObj, newObj any) {
	old, ok1 := oldObj.(*resourceapi.ResourceClaim)
	cur, ok2 := newObj.(*resourceapi.ResourceClaim)
	deallocated := ok1 && ok2 && old.Status.Allocation != nil && cur.Status.Allocation == nil
	if deallocated {
		// Before onClaim queues the claim's pods: a pod decided again
		// must already avoid the node it was refused on.
		c.onDeallocated(old)
	}
	c.onClaim(newObj)
	if deallocated {
		// Devices were freed: pods waiting for them may fit now.
		c.enqueueWaiting()
	}
}

func (c *Controller) onClaimDelete(obj any) {
	claim, ok := deletedObject[*resourceapi.ResourceClaim](obj)
	if !ok {
		return
	}
	c.forgetUnwanted(claim.UID)
	c.claimVersions.forget(claim.UID)
	c.settles.forget(claim.UID)
	c.handledClaims.forget(claim.UID)
	if c.isHoldRecord(claim) {
		c.ledger.Forget(claim.UID)
		c.enqueueWaiting()
		return
	}
	// A claim deleted while pods that reserved it may still run keeps
	// its devices counted until they end (holds.go); the finalizer that
	// should prevent that can be removed by the claim's owner.
	if !c.keepDeletedClaim(claim) {
		c.ledger.Forget(claim.UID)
		c.enqueueWaiting()
	}
	c.enqueueClaimPods(claim)
}

// deletedObject unwraps the object of a delete notification, which may
// come as a tombstone when the watch missed the deletion.
func deletedObject[T any](obj any) (T, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(T)
	return o, ok
}

// enqueueClaimPods enqueues the pods that use or reserve a claim.
func (c *Controller) enqueueClaimPods(claim *resourceapi.ResourceClaim) {
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			c.podQueue.Add(claim.Namespace + "/" + r.Name)
		}
	}
	for _, o := range claim.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" {
			c.podQueue.Add(claim.Namespace + "/" + o.Name)
		}
	}
	objs, err := c.podIdx.ByIndex(podClaimIndex, claim.Namespace+"/"+claim.Name)
	if err != nil {
		return
	}
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			c.podQueue.Add(pod.Namespace + "/" + pod.Name)
		}
	}
}

func (c *Controller) onSlice(obj any) {
	slice, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return
	}
	// Other drivers' slices are kept too (planner.Inventory), for claims
	// that ask for their devices with gpulink's.
	if err := c.inv.Upsert(slice); err != nil {
		c.metrics.Errors.WithLabelValues(errReasonInventory).Inc()
		var foreign *sliceformat.ForeignPoolError
		if errors.As(err, &foreign) {
			// Someone with write access to slices (a node's kubelet plugin
			// where the chart's admission policy is missing) tries to
			// speak for another node: worth an event an administrator
			// sees, not only a log line.
			klog.Background().Error(err, "Ignoring ResourceSlice whose pool is named after another node", "pool", slice.Spec.Pool.Name, "slice", klog.KObj(slice))
			c.explain.rec.Eventf(slice, nil, corev1.EventTypeWarning, report.ReasonSliceIgnored, actionInventory, "%s", err.Error())
		} else {
			klog.Background().Error(err, "Ignoring unusable gpulink pool", "pool", slice.Spec.Pool.Name, "slice", klog.KObj(slice))
		}
	} else if slice.Spec.Driver == driver.Name {
		c.seedLinkSeries(c.inv.Node(slice.Spec.Pool.Name))
	}
	c.steerSlice(slice)
	c.enqueueWaiting()
}

func (c *Controller) onSliceDelete(obj any) {
	slice, ok := deletedObject[*resourceapi.ResourceSlice](obj)
	if !ok {
		return
	}
	c.inv.Remove(slice)
	c.steerSlice(slice)
	c.enqueueWaiting()
}

func (c *Controller) onNodeAdd(obj any) {
	if node, ok := obj.(*corev1.Node); ok {
		c.filter.Allocatable.Set(node)
		c.steering.nodeChanged(nil, node)
		c.setTieKey(node)
	}
	c.onChange(obj)
}

func (c *Controller) onNodeUpdate(oldObj, newObj any) {
	old, ok1 := oldObj.(*corev1.Node)
	cur, ok2 := newObj.(*corev1.Node)
	if ok1 && ok2 && old.ResourceVersion == cur.ResourceVersion {
		return
	}
	if ok2 {
		c.filter.Allocatable.Set(cur)
		if !ok1 || !maps.Equal(old.Labels, cur.Labels) {
			c.setTieKey(cur)
		}
	}
	if ok1 && ok2 {
		c.steering.nodeChanged(old, cur)
	}
	if ok1 && ok2 && old.Spec.Unschedulable == cur.Spec.Unschedulable && apiequality.Semantic.DeepEqual(old.Spec.Taints, cur.Spec.Taints) && maps.Equal(old.Labels, cur.Labels) {
		// Other status-only updates (heartbeats) change nothing the
		// controller uses.
		return
	}
	c.onChange(newObj)
}

func (c *Controller) onNodeDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if node, ok := obj.(*corev1.Node); ok {
		c.filter.Allocatable.Forget(node.Name)
		c.inv.SetTieKey(node.Name, "")
	}
	c.onChange(obj)
}

// onChange retries waiting pods after a change that may help them.
func (c *Controller) onChange(any) { c.enqueueWaiting() }

func (c *Controller) enqueueWaiting() {
	// A waiting gang is evaluated again after this (gangRuns.unchanged).
	c.gangRuns.changes.Add(1)
	c.mu.Lock()
	keys := c.waiting.UnsortedList()
	c.mu.Unlock()
	for _, k := range keys {
		c.podQueue.Add(k)
	}
}

func (c *Controller) setWaiting(key string, waiting bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if waiting {
		c.waiting.Insert(key)
	} else {
		c.waiting.Delete(key)
	}
	c.metrics.PendingPods.Set(float64(c.waiting.Len()))
}
