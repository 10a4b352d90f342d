package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// Devices of deleted claims that pods still use.
//
// A claim's owner may delete the claim while its pod runs: the chart's
// claim-finalizer-guard policy refuses removing gpulink's finalizer from a
// reserved claim, but the policy may be absent and cluster admins may do
// it anyway. The pod keeps running with its GPUs (the kubelet does not
// stop containers whose claim is gone), so the controller must not hand
// those GPUs to the next claim. When a claim holding gpulink devices is
// deleted while a pod in its last seen status.reservedFor still exists,
// is bound to a node and has not finished, its devices stay counted:
//
//   - at once in the ledger (keepForPods), released when the last of those
//     pods ends or is deleted;
//   - durably, where Config.HoldNamespace is set, in a hold record: a
//     ResourceClaim in that namespace (labelled HoldLabel, named
//     gpulink-held-<deleted claim's UID>) whose status.allocation repeats
//     the deleted claim's devices and whose HoldAnnotation names the pods.
//     kube-scheduler counts every allocated claim's devices, so it will
//     not give them out either (it allocates gpulink devices to requests
//     that tolerate the managed taint of pods that are not gated), and a
//     restarted controller counts it from its informer like any claim.
//     The record is deleted once none of its pods may still run.
//
// What a restart cannot recover: a claim deleted while no controller ran
// (or in the moment between the informer's delete event and the record's
// creation) leaves nothing that names its devices. The pod's
// status.resourceClaimStatuses names the claim, not the devices, and the
// devices are known only to the node's kubelet plugin checkpoint. The
// kubelet plugin still refuses to prepare a claim that over-commits a GPU,
// so such a GPU is not used twice, but the next tenant's pod fails to
// start on it until the first pod ends.
const (
	// HoldLabel (value "true") marks a hold record in the hold namespace.
	HoldLabel = "gpu.gpulink.dev/held-devices"
	// HoldAnnotation carries a hold record's holdRecord as JSON.
	HoldAnnotation = "gpu.gpulink.dev/held-for"
	// holdNamePrefix + the deleted claim's UID names its hold record.
	holdNamePrefix = "gpulink-held-"
	// holdClass is the DeviceClass name a hold record's one request
	// names. No such class exists and nobody allocates the record: it is
	// a name gpulink's admission policies do not match, so the claim
	// finalizer policy leaves the record alone.
	holdClass = "held.gpu.gpulink.dev"
	// holdRequest is the record's one request, the request of every result.
	holdRequest = "held"
)

// releasedDeletedClaim is the Released metric's reason for the devices of a
// deleted claim given back once its pods ended.
const releasedDeletedClaim = "deleted-claim"

// holdRecord is what a hold record's HoldAnnotation says.
type holdRecord struct {
	// Claim is the deleted claim (namespace/name) and ClaimUID its UID.
	Claim    string    `json:"claim"`
	ClaimUID types.UID `json:"claimUID"`
	// Pods may still use the devices.
	Pods []heldPod `json:"pods"`
	// Allocation is the deleted claim's allocation as the record's status
	// carries it, so that a record whose status write was lost (a crash
	// between create and status update) is completed after a restart.
	Allocation *resourceapi.AllocationResult `json:"allocation"`
	// Requests (the deleted claim's request of each result, in order) and
	// Config (its allocation's configuration) are what the record's
	// status leaves out: its results all name the record's one request,
	// and the configuration names the deleted claim's requests. With
	// them the ledger counts each share in the sharing group it had: a
	// Concurrent MPS share stays in its namespace's group, whose MPS
	// server still runs (recordUses). Records written before they
	// existed lack both.
	Requests []string                                    `json:"requests,omitempty"`
	Config   []resourceapi.DeviceAllocationConfiguration `json:"config,omitempty"`
}

type heldPod struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
}

// heldPodIndex indexes hold records by the UIDs of the pods they hold for.
const heldPodIndex = "gpulink.dev/held-for-pod"

// isHoldRecord tells whether a claim is one of this controller's hold
// records. Only records in the hold namespace count: writing there is for
// the controller and cluster admins, so namespace users cannot forge one.
func (c *Controller) isHoldRecord(claim *resourceapi.ResourceClaim) bool {
	return c.holdNS != "" && claim.Namespace == c.holdNS && claim.Labels[HoldLabel] == "true"
}

// parseHoldRecord decodes a record's annotation.
func parseHoldRecord(claim *resourceapi.ResourceClaim) (*holdRecord, error) {
	raw, ok := claim.Annotations[HoldAnnotation]
	if !ok {
		return nil, fmt.Errorf("hold record %s/%s: annotation %s missing", claim.Namespace, claim.Name, HoldAnnotation)
	}
	r := &holdRecord{}
	if err := json.Unmarshal([]byte(raw), r); err != nil {
		return nil, fmt.Errorf("hold record %s/%s: annotation %s: %w", claim.Namespace, claim.Name, HoldAnnotation, err)
	}
	return r, nil
}

// indexHeldPods is the claim informer's heldPodIndex.
func (c *Controller) indexHeldPods(obj any) ([]string, error) {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok || !c.isHoldRecord(claim) {
		return nil, nil
	}
	r, err := parseHoldRecord(claim)
	if err != nil {
		// A broken record is reported by syncHoldRecord; an index error
		// would only make the informer log it on every event.
		return nil, nil
	}
	keys := make([]string, 0, len(r.Pods))
	for _, p := range r.Pods {
		keys = append(keys, string(p.UID))
	}
	return keys, nil
}

// recordUses is what a hold record holds: its allocation, or while that is
// not written yet, the allocation in its annotation, each share in the
// sharing group it had in the deleted claim (heldUses).
func recordUses(rec *resourceapi.ResourceClaim) ([]planner.DeviceUse, types.UID) {
	r, err := parseHoldRecord(rec)
	if rec.Status.Allocation != nil {
		if err != nil {
			return heldUses(rec.Status.Allocation, nil), ""
		}
		return heldUses(rec.Status.Allocation, r), r.ClaimUID
	}
	if err != nil || r.Allocation == nil {
		return nil, ""
	}
	return heldUses(r.Allocation, r), r.ClaimUID
}

// heldUses counts a hold record's allocation as the deleted claim's: with
// its results' requests, its configuration and its namespace, so that a
// share keeps the sharing group it had (planner.UsesOf). A record without
// them (written by an earlier version, or unreadable) cannot tell a
// Concurrent MPS share from another: each of its shares is then a group
// of its own, which no other share joins until the record goes.
func heldUses(alloc *resourceapi.AllocationResult, r *holdRecord) []planner.DeviceUse {
	probe := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: alloc.DeepCopy()}}
	if r != nil && len(r.Requests) == len(alloc.Devices.Results) {
		probe.Namespace, _, _ = strings.Cut(r.Claim, "/")
		for i := range probe.Status.Allocation.Devices.Results {
			probe.Status.Allocation.Devices.Results[i].Request = r.Requests[i]
		}
		probe.Status.Allocation.Devices.Config = r.Config
		return planner.UsesOf(probe)
	}
	uses := planner.UsesOf(probe)
	for i := range uses {
		if !uses[i].Exclusive && uses[i].Key.Driver == "" {
			uses[i].Group = unknownHeldGroup
		}
	}
	return uses
}

// unknownHeldGroup is the sharing group of a share held by a record that
// does not say which group it had (heldUses).
const unknownHeldGroup = "held/unknown-group"

// reservingPods returns the pods in a deleted claim's reservedFor that may
// still use its devices, judged from the cache: only a pod the cache shows
// finished is left out here. Bound or not, missing or replaced in the
// cache, the rest are confirmed by syncKept with live reads (an informer
// handler must not call the API server), which errs on keeping devices
// counted a little longer rather than freeing them early.
func (c *Controller) reservingPods(claim *resourceapi.ResourceClaim) map[types.UID]string {
	pods := map[types.UID]string{}
	for _, r := range claim.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		if pod, err := c.pods.Pods(claim.Namespace).Get(r.Name); err == nil && pod.UID == r.UID && planner.PodDone(pod) {
			continue
		}
		pods[r.UID] = r.Name
	}
	return pods
}

// podHolds tells whether a pod that reserved a deleted claim may still use
// its devices: it exists with the reserved UID, is bound to a node and has
// not finished. The cache answers when it shows the pod bound or
// finished; otherwise (missing, replaced, not bound yet) a live read does,
// so informer lag never frees devices a running pod uses.
func (c *Controller) podHolds(ctx context.Context, ns, name string, uid types.UID) (bool, error) {
	if pod, err := c.pods.Pods(ns).Get(name); err == nil && pod.UID == uid && (pod.Spec.NodeName != "" || planner.PodDone(pod)) {
		return !planner.PodDone(pod), nil
	}
	pod, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("checking pod %s/%s that used a deleted claim: %w", ns, name, err)
	}
	return pod.UID == uid && pod.Spec.NodeName != "" && !planner.PodDone(pod), nil
}

// keepDeletedClaim is onClaimDelete's part for a claim that held gpulink
// devices: it keeps them counted while reserving pods may still run and
// tells those pods' owners why. It reports whether anything is kept.
func (c *Controller) keepDeletedClaim(claim *resourceapi.ResourceClaim) bool {
	pods := c.reservingPods(claim)
	if !c.ledger.KeepForPods(claim, pods) {
		return false
	}
	devices := deviceList(claim.Status.Allocation)
	klog.Background().Info("Claim deleted while pods may still use it; its devices stay counted until they end",
		"claim", klog.KObj(claim), "claimUID", claim.UID, "devices", devices, "pods", sortedValues(pods))
	for uid, name := range pods {
		if pod, err := c.pods.Pods(claim.Namespace).Get(name); err == nil && pod.UID == uid {
			c.explain.rec.Eventf(pod, nil, corev1.EventTypeWarning, report.ReasonClaimDeletedInUse, actionHold,
				"ResourceClaim %s was deleted while this pod uses it; its GPUs (%s) stay counted as in use until the pod ends and are not given to other claims",
				claim.Name, strings.Join(devices, ", "))
		}
	}
	c.holdQueue.Add(claim.UID)
	return true
}

// syncKept confirms the pods a kept claim is counted for, releases it when
// none may still run, and writes its hold record.
func (c *Controller) syncKept(ctx context.Context, uid types.UID) error {
	logger := klog.FromContext(ctx)
	k, ok := c.ledger.KeptClaim(uid)
	if !ok {
		// Released (its pods ended) or replaced by its hold record.
		return nil
	}
	var errs []error
	for podUID, name := range k.Pods {
		holds, err := c.podHolds(ctx, k.Namespace, name, podUID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !holds && len(c.ledger.KeptPodEnded(uid, podUID)) > 0 {
			// Not recorded yet (that comes after this loop), so this is
			// the release.
			logger.Info("Released devices of a deleted claim: no pod that used it runs any more", "claim", klog.KRef(k.Namespace, k.Name), "claimUID", uid)
			c.metrics.Released.WithLabelValues(releasedDeletedClaim).Inc()
			c.enqueueWaiting()
			return nil
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Again, without the pods found gone above (and in case the record
	// took over meanwhile).
	if k, ok = c.ledger.KeptClaim(uid); !ok || c.holdNS == "" || k.Recorded {
		return nil
	}
	if err := c.writeHoldRecord(ctx, uid, &k); err != nil {
		logger.Error(err, "Cannot record devices of a deleted claim; they stay counted in this controller's memory only", "claim", klog.KRef(k.Namespace, k.Name))
		return err
	}
	c.ledger.MarkRecorded(uid)
	return nil
}

// writeHoldRecord creates the hold record of a kept claim, then writes its
// allocation (a create cannot set status). Both steps are idempotent: the
// record's name is derived from the deleted claim's UID.
func (c *Controller) writeHoldRecord(ctx context.Context, uid types.UID, k *planner.KeptClaim) error {
	claims := c.client.ResourceV1().ResourceClaims(c.holdNS)
	alloc := k.Allocation.DeepCopy()
	// The record's results all belong to its one request; the deleted
	// claim's configuration is left out of its status (it names the
	// deleted claim's requests, and nothing prepares a record). Both go
	// into the annotation, which keeps each share's sharing group.
	requests := make([]string, len(alloc.Devices.Results))
	for i := range alloc.Devices.Results {
		requests[i] = alloc.Devices.Results[i].Request
		alloc.Devices.Results[i].Request = holdRequest
	}
	config := alloc.Devices.Config
	alloc.Devices.Config = nil
	if alloc.AllocationTimestamp == nil {
		alloc.AllocationTimestamp = ptr.To(metav1.Now())
	}
	rec := holdRecord{Claim: k.Namespace + "/" + k.Name, ClaimUID: uid, Allocation: alloc, Requests: requests, Config: config}
	for podUID, name := range k.Pods {
		rec.Pods = append(rec.Pods, heldPod{Namespace: k.Namespace, Name: name, UID: podUID})
	}
	sort.Slice(rec.Pods, func(i, j int) bool { return rec.Pods[i].Name < rec.Pods[j].Name })
	raw, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding hold record of claim %s: %w", rec.Claim, err)
	}
	obj := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:        holdNamePrefix + string(uid),
			Namespace:   c.holdNS,
			Labels:      map[string]string{HoldLabel: "true"},
			Annotations: map[string]string{HoldAnnotation: string(raw)},
		},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: holdRequest,
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: holdClass,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(max(1, len(alloc.Devices.Results))),
			},
		}}}},
	}
	cur, err := claims.Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
	if apierrors.IsAlreadyExists(err) {
		cur, err = claims.Get(ctx, obj.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("creating hold record %s/%s for deleted claim %s: %w", c.holdNS, obj.Name, rec.Claim, err)
	}
	if cur.Status.Allocation != nil {
		return nil
	}
	upd := cur.DeepCopy()
	upd.Status.Allocation = alloc
	if _, err := claims.UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("writing allocation of hold record %s/%s for deleted claim %s: %w", c.holdNS, obj.Name, rec.Claim, err)
	}
	return nil
}

// syncHoldRecord deletes a hold record once none of its pods may still
// run, and completes one whose allocation was not written.
func (c *Controller) syncHoldRecord(ctx context.Context, rec *resourceapi.ResourceClaim) error {
	logger := klog.FromContext(ctx)
	r, err := parseHoldRecord(rec)
	if err != nil {
		// Left alone: its allocation (if any) stays counted, and only
		// an admin can have written it this way.
		logger.Error(err, "Ignoring unreadable hold record", "record", klog.KObj(rec))
		return nil
	}
	for _, p := range r.Pods {
		holds, err := c.podHolds(ctx, p.Namespace, p.Name, p.UID)
		if err != nil {
			return err
		}
		if !holds {
			continue
		}
		if rec.Status.Allocation == nil && r.Allocation != nil {
			upd := rec.DeepCopy()
			upd.Status.Allocation = r.Allocation
			if _, err := c.client.ResourceV1().ResourceClaims(rec.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
				return fmt.Errorf("writing allocation of hold record %s/%s: %w", rec.Namespace, rec.Name, err)
			}
		}
		return nil
	}
	err = c.client.ResourceV1().ResourceClaims(rec.Namespace).Delete(ctx, rec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &rec.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting hold record %s/%s of deleted claim %s: %w", rec.Namespace, rec.Name, r.Claim, err)
	}
	logger.Info("Released devices of a deleted claim: no pod that used it runs any more", "claim", r.Claim, "claimUID", r.ClaimUID, "record", klog.KObj(rec))
	c.metrics.Released.WithLabelValues(releasedDeletedClaim).Inc()
	return nil
}

// podEndedForHolds releases what was kept for a pod that finished or was
// deleted: kept claims in the ledger at once, hold records through the
// claim queue (their deletion frees the devices when the informer shows it).
func (c *Controller) podEndedForHolds(pod *corev1.Pod) {
	if released := c.ledger.KeptPodEnded("", pod.UID); len(released) > 0 {
		for uid, recorded := range released {
			klog.Background().Info("Released devices of a deleted claim: the pod that used it ended", "pod", klog.KObj(pod), "claimUID", uid)
			if !recorded {
				// A recorded one counts when its record is deleted.
				c.metrics.Released.WithLabelValues(releasedDeletedClaim).Inc()
			}
		}
		c.enqueueWaiting()
	}
	if c.claimIdx == nil {
		return
	}
	objs, err := c.claimIdx.ByIndex(heldPodIndex, string(pod.UID))
	if err != nil {
		return
	}
	for _, o := range objs {
		if rec, ok := o.(*resourceapi.ResourceClaim); ok {
			c.gcQueue.Add(rec.Namespace + "/" + rec.Name)
		}
	}
}

// deviceList names an allocation's gpulink devices (pool/device).
func deviceList(a *resourceapi.AllocationResult) []string {
	if a == nil {
		return nil
	}
	var out []string
	for _, r := range a.Devices.Results {
		if r.Driver == driver.Name {
			out = append(out, r.Pool+"/"+r.Device)
		}
	}
	return out
}

func sortedValues(m map[types.UID]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}
