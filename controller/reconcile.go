package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
)

// podClaims is what syncPod learns about the claims of one pod.
type podClaims struct {
	// all claims of the pod that exist, any driver.
	all []*resourceapi.ResourceClaim
	// ours are the gpulink claims (interpreted), allocated or not.
	ours []*planner.Claim
	// notReady explains why the pod must wait before any decision (a
	// claim not created yet, a DeviceClass missing); empty when ready.
	notReady string
	// missingClass is set when notReady is a DeviceClass that does not exist.
	missingClass bool
	// heldByGate is set when notReady is another controller's scheduling
	// gate (othergates.go).
	heldByGate bool
	// broken is a claim gpulink cannot allocate exactly.
	broken error
}

// syncPod drives one pod: allocate its pending gpulink claims, hand it to
// kube-scheduler, or release an allocation kube-scheduler could not use.
func (c *Controller) syncPod(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.setWaiting(key, false)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading pod %s from cache: %w", key, err)
	}
	if !podLive(pod) {
		c.setWaiting(key, false)
		c.forgetRollbacks(pod.UID)
		return nil
	}
	if pod.Spec.NodeName != "" {
		// Bound: kube-scheduler reserved the claims it bound the pod
		// with, so no rollback of an earlier decision applies any more.
		c.forgetRollbacks(pod.UID)
	} else if did, err := c.rollbackStale(ctx, pod); err != nil {
		return err
	} else if did {
		// The cache shows the rolled-back claims as they were; the
		// claim updates bring the pod back.
		return nil
	}
	logger = logger.WithValues("pod", klog.KObj(pod))
	ctx = klog.NewContext(ctx, logger)
	if pod.Spec.NodeName == "" {
		if err := c.persistExcluded(ctx, pod); err != nil {
			return err
		}
	}

	pc := c.collectClaims(ctx, pod)
	switch {
	case pc.broken != nil:
		c.setWaiting(key, true)
		c.metrics.Errors.WithLabelValues(errReasonUninterpretable).Inc()
		c.metrics.Decisions.WithLabelValues(OutcomeInvalid).Inc()
		logger.Info("Claim cannot be allocated by gpulink", "err", pc.broken)
		c.explain.event(pod, nil, corev1.EventTypeWarning, report.ReasonUninterpretable, actionAllocate, pc.broken.Error())
		return nil
	case pc.notReady != "":
		c.setWaiting(key, true)
		c.metrics.Decisions.WithLabelValues(OutcomeNotReady).Inc()
		logger.V(4).Info("Pod not ready for allocation", "reason", pc.notReady)
		if pc.missingClass {
			c.explain.event(pod, nil, corev1.EventTypeWarning, report.ReasonWaiting, actionWait, "waiting: "+pc.notReady)
		}
		if pc.heldByGate {
			c.explain.event(pod, nil, corev1.EventTypeNormal, report.ReasonWaiting, actionWait, "waiting: "+pc.notReady)
		}
		return nil
	}
	if len(pc.ours) == 0 {
		c.setWaiting(key, false)
		if c.placeCPUPods && len(pod.Spec.ResourceClaims) == 0 && !c.handedOver(pod) && pod.Spec.NodeName == "" {
			return c.placeHostPod(ctx, pod)
		}
		if !c.handedOver(pod) {
			if err := c.ungate(ctx, pod); err != nil {
				return err
			}
			logger.V(2).Info("Removed scheduling gate from pod without gpulink claims")
			c.explain.event(pod, nil, corev1.EventTypeNormal, report.ReasonGateRemoved, actionUngate, "no gpulink claims: handed to kube-scheduler")
		}
		return nil
	}

	// A pod whose gate this controller removed is kube-scheduler's, even
	// while the cache still shows the gate: its claims may already have
	// been released by kube-scheduler refusing it (gang_replace.go).
	gated := !c.handedOver(pod)
	if gated {
		msg := c.mpsUserConflict(pod, pc.ours)
		if msg == "" {
			msg = c.mpsGroupUserConflict(pod, pc.ours, concurrentDevices(pc.ours))
		}
		if msg != "" {
			c.setWaiting(key, true)
			c.metrics.Decisions.WithLabelValues(OutcomeNotReady).Inc()
			logger.Info("Pod kept gated: its MPS claim would serve several users", "reason", msg)
			c.explain.event(pod, nil, corev1.EventTypeWarning, report.ReasonMPSUsersDiffer, actionWait, msg)
			return nil
		}
	}
	if ref, ok := c.gangOf(pod); ok && gated {
		// A gang's pods are decided together (gang.go).
		return c.syncGang(ctx, key, pod, ref)
	}
	var pending []*planner.Claim
	for _, ic := range pc.ours {
		if ic.Claim.Status.Allocation == nil {
			if ic.Tolerating && !gated {
				// kube-scheduler already sees this pod and may allocate
				// the claim (its requests tolerate the managed taint):
				// two allocators deciding one claim would race. Its
				// result is counted once written, and the kubelet
				// plugin checks it by the controller's rules.
				continue
			}
			if c.ledger.InFlight(ic.Claim.UID) {
				// Our own write is in flight or not yet in the informer:
				// the claim update will bring the pod back.
				return nil
			}
			pending = append(pending, ic)
		}
	}
	if d, cl := c.settlingClaim(pending); d > 0 {
		logger.V(2).Info("Claim released moments ago under a pod kube-scheduler holds; allocating it again once that pod's binding can no longer use the old allocation", "claim", klog.KObj(cl), "after", d)
		c.podQueue.AddAfter(key, d)
		return nil
	}
	if len(pending) == 0 {
		c.setWaiting(key, false)
		if pod.Spec.NodeName == "" {
			// Allocated, not bound yet (possibly decided before a
			// restart): the pod counts on that node for the node fit.
			for _, ic := range pc.ours {
				if n := allocatedNode(ic.Claim); n != "" {
					c.fit.Assume(pod, n)
					break
				}
			}
		}
		if gated {
			// Allocated (possibly by a previous run that stopped before
			// ungating): hand the pod over.
			if err := c.handOver(ctx, pod, pc.all); err != nil {
				return err
			}
			logger.V(2).Info("Removed scheduling gate; all gpulink claims are allocated")
			return nil
		}
		if pod.Spec.NodeName != "" {
			c.reportBoundElsewhere(ctx, pod, pc)
			return nil
		}
		return c.checkUnschedulable(ctx, pod, pc)
	}
	if ref, ok := c.gangOf(pod); ok {
		// Ungated, its allocation refused by kube-scheduler: placed
		// again within its gang's domain (gang_replace.go).
		return c.replaceGangPod(ctx, key, pod, ref, pc, pending)
	}
	return c.allocatePod(ctx, key, pod, pc, pending)
}

// collectClaims gathers and interprets the pod's claims.
func (c *Controller) collectClaims(ctx context.Context, pod *corev1.Pod) podClaims {
	var pc podClaims
	for i := range pod.Spec.ResourceClaims {
		podClaim := &pod.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(pod, podClaim)
		if err != nil {
			if errors.Is(err, resourceclaim.ErrClaimNotFound) {
				pc.notReady = fmt.Sprintf("claim %q of the pod has not been created from its template yet", podClaim.Name)
				return pc
			}
			pc.broken = fmt.Errorf("pod claim %q: %w", podClaim.Name, err)
			return pc
		}
		if name == nil {
			continue
		}
		claim, err := c.claims.ResourceClaims(pod.Namespace).Get(*name)
		if err != nil {
			pc.notReady = fmt.Sprintf("claim %s/%s not found", pod.Namespace, *name)
			return pc
		}
		if mustCheckOwner {
			// A claim of the pod's PodGroup (DRAWorkloadResourceClaims)
			// is accepted here; a gpulink one is refused below.
			if err := resourceclaim.IsForPod(pod, claim, c.gangCfg.PodGroups); err != nil {
				pc.notReady = err.Error()
				return pc
			}
		}
		if claim.DeletionTimestamp != nil {
			pc.notReady = fmt.Sprintf("claim %s/%s is being deleted", claim.Namespace, claim.Name)
			return pc
		}
		if c.claimVersions.behind(claim) {
			pc.notReady = fmt.Sprintf("claim %s/%s: its allocation was removed and the controller's cache does not show that yet", claim.Namespace, claim.Name)
			return pc
		}
		if c.handledClaims.deallocationPending(claim) {
			pc.notReady = fmt.Sprintf("claim %s/%s: its allocation was removed and the controller has not reacted to that yet", claim.Namespace, claim.Name)
			return pc
		}
		if err := planner.CheckCompatClaim(podClaim, claim); err != nil {
			pc.broken = err
			return pc
		}
		pc.all = append(pc.all, claim)
		ic, kind, err := c.interp.Interpret(ctx, claim)
		switch {
		case errors.Is(err, planner.ErrClassMissing):
			pc.notReady = err.Error()
			pc.missingClass = true
			return pc
		case err != nil:
			pc.broken = err
			return pc
		case kind == planner.ClaimOurs && podGroupClaim(claim):
			pc.broken = fmt.Errorf("claim %s/%s is a PodGroup-level ResourceClaim (PodGroup spec.resourceClaims, from a Workload's podGroupTemplates[].resourceClaims; KEP-5729) of gpulink devices: "+
				"not supported, because gpulink devices belong to one node and gpulink allocates each pod's claims for that pod's node; give every pod its own claim (resourceClaimTemplateName in the pod template) and make the pods a gang", claim.Namespace, claim.Name)
			return pc
		case kind == planner.ClaimOurs:
			pc.ours = append(pc.ours, ic)
		}
	}
	if held := heldByOtherGate(pod, pc); held != "" {
		pc.notReady, pc.heldByGate = held, true
	}
	return pc
}

// allocatePod decides and writes the allocation of the pending claims.
func (c *Controller) allocatePod(ctx context.Context, key string, pod *corev1.Pod, pc podClaims, pending []*planner.Claim) error {
	return c.allocatePodNear(ctx, key, pod, pc, pending, gangHome{})
}

// allocatePodNear is allocatePod for a further pod of a gang with pods
// placed: in home's domains, tightest first (gang_home.go); without steps,
// anywhere.
func (c *Controller) allocatePodNear(ctx context.Context, key string, pod *corev1.Pod, pc podClaims, pending []*planner.Claim, home gangHome) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	own, err := planner.PodPlacement(pod, pending)
	if err != nil {
		c.setWaiting(key, true)
		c.metrics.Errors.WithLabelValues(errReasonUninterpretable).Inc()
		c.metrics.Decisions.WithLabelValues(OutcomeInvalid).Inc()
		logger.Info("Pod's placement policy cannot be applied", "err", err)
		c.explain.event(pod, pending[0].Claim, corev1.EventTypeWarning, report.ReasonUninterpretable, actionAllocate, err.Error())
		return nil
	}
	if err := planner.MIGMixError(pending); err != nil {
		c.setWaiting(key, true)
		c.metrics.Errors.WithLabelValues(errReasonUninterpretable).Inc()
		c.metrics.Decisions.WithLabelValues(OutcomeInvalid).Inc()
		logger.Info("Claim mixes MIG devices with whole GPUs or shares", "err", err)
		c.explain.event(pod, pending[0].Claim, corev1.EventTypeWarning, report.ReasonUninterpretable, actionAllocate, err.Error())
		return nil
	}
	var allocated []*resourceapi.ResourceClaim
	for _, cl := range pc.all {
		if cl.Status.Allocation != nil {
			allocated = append(allocated, cl)
		}
	}

	// The claims' selectors are evaluated before the lock, within a time
	// bound per attempt: a costly selector delays its own pod, not every
	// other pod's decision (planner.PrepareSelectors).
	if err := c.prepareSelectors(ctx, key, pod, pending); err != nil {
		return err
	}

	c.decideMu.Lock()
	planStart := time.Now()
	// The claims were read from the cache before the lock: another pod
	// sharing one of them may have decided it since. A claim is decided
	// once; this pod comes back when the claim's update arrives and then
	// uses that decision.
	for _, ic := range pending {
		if c.ledger.Held(ic.Claim.UID) {
			c.decideMu.Unlock()
			logger.V(4).Info("Claim decided meanwhile by another pod; waiting for its allocation", "claim", klog.KObj(ic.Claim))
			return nil
		}
	}
	req := planner.Request{Pod: pod, Pending: pending, Allocated: allocated, Excluded: c.excludedNodes(pod), Placement: own}
	var d planner.Decision
	steps := home.tryOrder(c.hierarchy.Cluster())
	var step int // set by decideSteps
	if home.rail != "" {
		// The NICs of the rails the gang's pods do not use are held off
		// in the planning only: a waiting pod's nodes without room stay
		// kept from one retry to the next.
		req.HeldOff = c.railsHeldOff(home.rail)
	}
	decideSteps := func() {
		for step = 0; step < len(steps); step++ {
			req.Within = steps[step].nodes
			if step < len(steps)-1 && req.Excluded.Len() > 0 {
				// The nodes the pod was refused on are tried again only
				// when nothing else fits (the planner's ExclusionsIgnored),
				// which is for the last step to find, not a tighter one.
				req.Within = slices.DeleteFunc(slices.Clone(req.Within), req.Excluded.Has)
				if len(req.Within) == 0 {
					continue
				}
			}
			d = c.planner.Decide(ctx, req)
			if d.Chosen != nil {
				break
			}
		}
	}
	decideSteps()
	if d.Chosen == nil && d.HeldOffByReservation() {
		// It fits nowhere else: a soft reservation lets it onto the
		// reserved domain (gang_reserve_soft.go).
		held := d
		if c.pastSoftReservation(c.passKey(pod), decideSteps) && d.Chosen != nil {
			logger.V(2).Info("Placed on a domain a gang reserves softly: it fits nowhere else", "node", d.Chosen.Node.Node)
		} else if d.Chosen == nil {
			d = held // the waiting event names the reservation
		}
	}
	step = min(step, len(steps)-1)
	if d.ExclusionsIgnored {
		c.resetExcluded(ctx, pod)
	}
	chosen := d.Chosen
	if chosen == nil {
		c.decideMu.Unlock()
		c.setWaiting(key, true)
		c.metrics.Errors.WithLabelValues(errReasonUnsatisfiable).Inc()
		c.metrics.Decisions.WithLabelValues(OutcomeWaiting).Inc()
		msg := c.planner.WaitingMessage(pending, d)
		if home.rail != "" {
			msg += fmt.Sprintf("; NIC rails %s only, as its gang's placed pods", home.rail)
		}
		logger.V(2).Info("Waiting for devices", "reason", msg)
		c.explain.event(pod, pending[0].Claim, corev1.EventTypeWarning, report.ReasonWaiting, actionWait, msg)
		return nil
	}
	if msg := c.mpsGroupUserConflict(pod, pc.ours, plannedConcurrentDevices(chosen)); msg != "" {
		c.decideMu.Unlock()
		c.setWaiting(key, true)
		c.metrics.Decisions.WithLabelValues(OutcomeNotReady).Inc()
		logger.Info("Pod kept gated: its MPS shares would join another user's MPS server", "reason", msg)
		c.explain.event(pod, pending[0].Claim, corev1.EventTypeWarning, report.ReasonMPSUsersDiffer, actionWait, msg)
		return nil
	}
	now := metav1.Now()
	writes := make([]pendingWrite, 0, len(pending))
	for i, ic := range pending {
		alloc, uses := buildAllocation(ic, chosen.Node, chosen.Claims[i], chosen.ForeignResults(i), now)
		settle, ok := c.ledger.Assume(ic.Claim.UID, uses)
		if !ok {
			// Cannot happen while held() was false under the lock; never
			// overwrite another decision if it does.
			for _, w := range writes {
				w.settle("", false)
			}
			c.decideMu.Unlock()
			return fmt.Errorf("claim %s/%s was decided by another pod during this decision", ic.Claim.Namespace, ic.Claim.Name)
		}
		writes = append(writes, pendingWrite{ic: ic, alloc: alloc, settle: settle})
	}
	// The pod counts on the node from now on, so that the next decision
	// does not hand the same free CPUs to another pod.
	c.fit.Assume(pod, chosen.Node.Node)
	c.planner.Record(ctx, pod, chosen)
	c.metrics.PlanLatency.Observe(time.Since(planStart).Seconds())
	c.decideMu.Unlock()

	// From here on the pod counts as a user of its claims for the MPS
	// user check of pods sharing them (mpsusers.go), before its gate is
	// removed or kube-scheduler reserves the claims for it.
	c.setDecided(pod.UID, true)
	if err := c.writeDecision(ctx, pod, writes); err != nil {
		c.setDecided(pod.UID, false)
		c.fit.Unassume(pod.UID)
		c.metrics.Decisions.WithLabelValues(OutcomeError).Inc()
		return err
	}
	c.metrics.Decisions.WithLabelValues(OutcomeAllocated).Inc()
	c.setWaiting(key, false)
	c.metrics.DecisionLatency.Observe(time.Since(start).Seconds())
	c.metrics.AllocationLatency.Observe(time.Since(pod.CreationTimestamp.Time).Seconds())
	for _, claim := range chosen.Claims {
		for _, r := range claim {
			label := weakestLinkShare
			switch {
			case len(r.MIG) > 0:
				label = weakestLinkMIG
			case r.Share == nil:
				label = r.Weakest.String()
			}
			c.metrics.Allocations.WithLabelValues(label).Inc()
			c.countBelowBest(chosen.Node, r)
		}
	}
	summary := chosen.Summarize()
	logger.Info("Allocated", "node", chosen.Node.Node, "devices", summary, "duration", time.Since(start))
	homeNote := ""
	if home.placed > 0 {
		span := home.span(c, []string{chosen.Node.Node})
		homeNote = home.placedNote(c, step, span)
		if msg := home.relaxedNote(c, span); msg != "" {
			c.explain.rec.Eventf(pod, nil, corev1.EventTypeWarning, report.ReasonGangRelaxed, actionAllocate, "%s", msg)
		}
	}
	c.explain.event(pod, pending[0].Claim, corev1.EventTypeNormal, report.ReasonAllocated, actionAllocate, "allocated "+summary+homeNote+chosen.MIGPlacementNote()+own.Note()+planner.AlternativesNote(chosen, d.Plans, d.Why, d.Rejections.Details, d.Unexamined))
	c.explainPriority(pod, chosen, pending)
	if err := c.handOver(ctx, pod, allocated); err != nil {
		return err
	}
	return nil
}

// countBelowBest counts a set of whole GPUs whose weakest link is below
// the node's best for its size: the node could have done better idle, so
// fragmentation or a selector cost the request link speed.
func (c *Controller) countBelowBest(n *planner.NodeInventory, r planner.PlacedResult) {
	k := len(r.Positions)
	if r.Share != nil || k < 2 {
		return
	}
	if best, ok := n.BestLink(k); ok && r.Weakest < best {
		c.metrics.BelowBestLink.WithLabelValues(strconv.Itoa(k), r.Weakest.String()).Inc()
	}
}

// podGroupClaim tells whether a claim was created for a PodGroup (its
// controller is a scheduling.k8s.io PodGroup) rather than for a pod.
func podGroupClaim(claim *resourceapi.ResourceClaim) bool {
	ref := metav1.GetControllerOfNoCopy(claim)
	return ref != nil && ref.Kind == "PodGroup" && strings.HasPrefix(ref.APIVersion, "scheduling.k8s.io/")
}
