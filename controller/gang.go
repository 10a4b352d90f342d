package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// podGangIndex indexes pods by their gang's key (gangs.Ref.Key).
const podGangIndex = "gpulink.dev/gang"

// GangConfig configures the placement of gangs: pods placed all or
// nothing, link-minimal across the cluster's hierarchy (gang*.go).
type GangConfig struct {
	// Hierarchy is the cluster's levels above one node, from node
	// labels, tightest first; nil: gang.DefaultHierarchy (NVLink clique,
	// Topograph accelerator, leaf, spine, zone).
	Hierarchy *gang.Hierarchy
	// PodGroups watches scheduling.k8s.io/v1beta1 PodGroups, so that pods
	// naming one in spec.schedulingGroup are placed by its gang policy.
	// Turn on only where the Workload API is served (feature gate
	// GenericWorkload); off, pods are gangs through their labels only.
	PodGroups bool
	// DefaultLevel and DefaultPolicy apply to gangs that name no level:
	// a level name or node label key of Hierarchy, Required or Preferred.
	// Empty: Preferred at the lowest level that fits.
	DefaultLevel  string
	DefaultPolicy gangs.Policy
	// StarvationBound: a gang that has waited longer than this (from the
	// creation of its oldest pod) reserves the domain it is closest to
	// fitting in, so that no other pod is placed there until the gang is
	// placed or gone; one gang at a time, the one of the highest level
	// first, then the longest waiting (gang_reserve.go). 0: gangs never
	// reserve.
	StarvationBound time.Duration
	// PreferredStarvationBound replaces StarvationBound for a gang whose
	// level is not Required: it may span any domain that holds it, so it
	// waits only while the whole cluster has no room for it, and a domain
	// reserved for it early drains for nothing when it then starts
	// elsewhere (gang_reserve.go, starvationBound). 0: StarvationBound.
	// A StarvationBound of 0 turns reservations off for every gang.
	PreferredStarvationBound time.Duration
	// StrictReservationBound: until the gang holding the reservation has
	// waited this long, the reservation is soft: it holds its domain
	// only against the pods that fit nowhere else in the cluster; after
	// it, against every pod (gang_reserve_soft.go). 0, or not above
	// the holder's starvation bound: strict from the start.
	StrictReservationBound time.Duration
	// RailAttribute is the fully qualified attribute (domain/name) of
	// other drivers' devices that names a NIC's rail, for gangs with
	// aligned rails (gang_rails.go); empty: a NIC's position among its
	// driver's devices of the node in natural name order.
	RailAttribute string
}

// gangOf returns the gang a pod is in, if any: gangs.Resolve with the
// PodGroups as the informer has them (a basic PodGroup yields to the pod's
// gang labels).
func (c *Controller) gangOf(pod *corev1.Pod) (gangs.Ref, bool) {
	var lookup gangs.PodGroupLookup
	if c.podGroups != nil {
		lookup = func(ns, name string) (*schedulingv1beta1.PodGroup, bool) {
			pg, err := c.podGroups.PodGroups(ns).Get(name)
			return pg, err == nil
		}
	}
	return gangs.Resolve(pod, c.gangCfg.PodGroups, lookup)
}

// indexPodGang indexes a pod under every gang it may be in (its PodGroup
// and its label gang): which one it is depends on the PodGroup's policy,
// which the pod's index entry cannot follow. gangPods keeps the pods that
// are in the gang.
func (c *Controller) indexPodGang(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, ref := range gangs.Candidates(pod, c.gangCfg.PodGroups) {
		keys = append(keys, ref.Key())
	}
	return keys, nil
}

// gangPods returns the pods in the gang of key (gangOf), live or not.
func (c *Controller) gangPods(key string) []*corev1.Pod {
	objs, err := c.podIdx.ByIndex(podGangIndex, key)
	if err != nil {
		return nil
	}
	var out []*corev1.Pod
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			if ref, ok := c.gangOf(pod); ok && ref.Key() == key {
				out = append(out, pod)
			}
		}
	}
	return out
}

// gangSpec reads what the gang asks for; notReady says why it cannot be
// known yet (its PodGroup is not created), err that it is invalid, and
// isGang false that a PodGroup with the basic policy makes no gang.
func (c *Controller) gangSpec(ref gangs.Ref, pod *corev1.Pod) (spec gangs.Spec, isGang bool, notReady string, err error) {
	switch ref.Source {
	case gangs.SourcePodGroup:
		pg, gerr := c.podGroups.PodGroups(ref.Namespace).Get(ref.Name)
		if apierrors.IsNotFound(gerr) {
			return gangs.Spec{}, true, fmt.Sprintf("PodGroup %s/%s named by the pod's spec.schedulingGroup does not exist (yet)", ref.Namespace, ref.Name), nil
		}
		if gerr != nil {
			return gangs.Spec{}, true, fmt.Sprintf("reading PodGroup %s/%s: %v", ref.Namespace, ref.Name, gerr), nil
		}
		spec, isGang, err = gangs.FromPodGroup(ref, pg, pod)
	default:
		spec, err = gangs.FromLabels(ref, pod)
		isGang = true
	}
	if err != nil || !isGang {
		return gangs.Spec{}, isGang, "", err
	}
	if spec.Level == "" && c.gangCfg.DefaultLevel != "" {
		spec.Level, spec.Policy, spec.Why = c.gangCfg.DefaultLevel, c.gangCfg.DefaultPolicy, "the controller's --gang-default-level"
	}
	if spec.Policy == "" {
		spec.Policy = gangs.Preferred
	}
	return spec, true, "", nil
}

// gangRequest maps a gang's spec to driver/gang's request.
func (c *Controller) gangRequest(spec gangs.Spec, pods, need, gpusPerPod int) (gang.Request, error) {
	req := gang.Request{Name: spec.Name, Pods: pods, MinCount: need, GPUsPerPod: gpusPerPod}
	if spec.Level == "" {
		// No level asked: the lowest level that fits, nothing relaxed.
		req.Constraint = gang.None
		return req, nil
	}
	req.Constraint = gang.Preferred
	if spec.Policy == gangs.Required {
		req.Constraint = gang.Required
	}
	h := c.hierarchy
	level, ok := h.LevelOfKey(spec.Level)
	if !ok {
		level, ok = h.LevelOfName(spec.Level)
	}
	if !ok {
		return gang.Request{}, fmt.Errorf("%s: level %q (%s) is neither a node label key nor a level name of the controller's hierarchy (%s; configure it with the chart's gangs.hierarchy)",
			spec.Ref, spec.Level, spec.Why, strings.Join(h.Keys(), ", "))
	}
	req.Level = level
	return req, nil
}

// gangMember is one pod of a gang as syncGang sees it.
type gangMember struct {
	pod *corev1.Pod
	key string
	pc  podClaims
	// pending are its gpulink claims not allocated yet.
	pending []*planner.Claim
	// allocated are its claims (any driver) already allocated.
	allocated []*planner.Claim
	// refused: ungated, not bound, its gpulink claims released after
	// kube-scheduler refused it, decided again with its gang
	// (gang_replace.go).
	refused bool
	// handedOver: its gate is gone, from the cached pod or by this
	// controller's removal that the cache has not shown yet
	// (Controller.handedOver).
	handedOver bool
}

// gated: still behind gpulink's scheduling gate, as far as the controller
// knows: a pod whose gate it removed counts as ungated before its pod
// informer shows it so, since kube-scheduler may already have refused the
// pod and released its claims.
func (m *gangMember) gated() bool { return !m.handedOver }

// ready: its claims exist and can be allocated by gpulink.
func (m *gangMember) ready() bool { return m.pc.broken == nil && m.pc.notReady == "" }

// members lists the gang's live pods (not deleted, not finished), by name.
func (c *Controller) gangMembers(ctx context.Context, ref gangs.Ref) []*gangMember {
	var out []*gangMember
	for _, pod := range c.gangPods(ref.Key()) {
		if !podLive(pod) {
			continue
		}
		m := &gangMember{pod: pod, key: pod.Namespace + "/" + pod.Name, handedOver: c.handedOver(pod)}
		if m.gated() {
			m.pc = c.collectClaims(ctx, pod)
			for _, ic := range m.pc.ours {
				if ic.Claim.Status.Allocation == nil {
					m.pending = append(m.pending, ic)
				} else {
					m.allocated = append(m.allocated, ic)
				}
			}
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *gangMember) int { return strings.Compare(a.pod.Name, b.pod.Name) })
	return out
}

// syncGang drives the gang of a gated pod with pending gpulink claims:
// it finishes or rolls back a decision an earlier run left half written,
// waits until minCount pods exist, and then places all of them at once
// (gang_decide.go). A gang that already runs minCount pods places further
// pods (replacements, pods beyond minCount) one by one.
func (c *Controller) syncGang(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref) error {
	return c.inGangRun(ctx, key, ref, func(ctx context.Context) error {
		return c.syncGangExclusive(ctx, key, pod, ref)
	})
}

func (c *Controller) syncGangExclusive(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref) error {
	members := c.gangMembers(ctx, ref)
	fp := c.gangRuns.fingerprint(members)
	if c.gangRuns.unchanged(ref.Key(), fp) {
		klog.FromContext(ctx).V(5).Info("Gang unchanged since it last waited")
		return nil
	}
	c.gangRuns.evaluations.Add(1)
	err := c.evaluateGang(ctx, key, pod, ref, members)
	c.mu.Lock()
	waiting := c.waiting.Has(key)
	c.mu.Unlock()
	// Recorded only when the evaluation ended waiting without an error:
	// anything else must be evaluated again.
	c.gangRuns.waitedAt(ref.Key(), fp, err == nil && waiting)
	return err
}

// evaluateGang is syncGang's work on the gang's members as read.
func (c *Controller) evaluateGang(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref, members []*gangMember) error {
	logger := klog.FromContext(ctx)
	spec, isGang, notReady, err := c.gangSpec(ref, pod)
	switch {
	case err != nil:
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonUninterpretable, actionWait, err.Error())
		c.setGangWaiting(members, true)
		return nil
	case notReady != "":
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonGangWaiting, actionWait, "waiting: "+notReady)
		c.setGangWaiting(members, true)
		return nil
	case !isGang:
		// A PodGroup with the basic policy: its pods are placed one by one.
		return c.syncSingle(ctx, key, pod, gangHome{})
	}
	if spec, err = c.computeDomainSpec(spec, members); err != nil {
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonGangWaiting, actionWait, "waiting: "+err.Error())
		c.setGangWaiting(members, true)
		return nil
	}
	for _, m := range members {
		for _, ic := range m.pc.ours {
			if c.ledger.InFlight(ic.Claim.UID) {
				// A write of ours is not in the informer yet: its update
				// brings the pods back.
				return nil
			}
		}
	}
	for _, m := range members {
		if d, cl := c.settlingClaim(m.pending); d > 0 {
			logger.V(2).Info("Claim of a gang's pod released moments ago under a pod kube-scheduler holds; deciding the gang once that pod's binding can no longer use the old allocation", "claim", klog.KObj(cl), "after", d)
			// Not a wait for room: were the gang's last evaluation
			// recorded as one, the retry below would be skipped as
			// unchanged (syncGangExclusive).
			c.setGangWaiting(members, false)
			c.podQueue.AddAfter(key, d)
			return nil
		}
	}
	if done, err := c.recoverGang(ctx, spec, members); done || err != nil {
		return err
	}
	running, ready := 0, []*gangMember{}
	var notReadyWhy []string
	for _, m := range members {
		switch {
		case !m.gated():
			running++
		case !m.ready():
			why := m.pc.notReady
			if m.pc.broken != nil {
				why = m.pc.broken.Error()
			}
			notReadyWhy = append(notReadyWhy, fmt.Sprintf("pod %s: %s", m.pod.Name, why))
		case len(m.pending) > 0:
			ready = append(ready, m)
		}
	}
	if running >= spec.MinCount {
		// The gang runs: a further pod is placed on its own, as close to
		// the running pods as it fits (gang_home.go), and the running
		// ones are never touched.
		c.setGangWaiting(members, false)
		return c.syncSingle(ctx, key, pod, c.gangHome(ctx, spec, members))
	}
	need := spec.MinCount - running
	if len(ready) < need {
		msg := fmt.Sprintf("waiting: %s: %d of %d pods to place together exist and are ready", spec.Ref, len(ready)+running, spec.MinCount)
		if running > 0 {
			msg += fmt.Sprintf(" (%d running)", running)
		}
		if len(notReadyWhy) > 0 {
			msg += "; not ready: " + strings.Join(notReadyWhy[:min(3, len(notReadyWhy))], "; ")
		}
		logger.V(2).Info("Gang waiting for its pods", "ready", len(ready), "running", running, "minCount", spec.MinCount)
		c.gangEvent(members, corev1.EventTypeNormal, report.ReasonGangWaiting, actionWait, msg)
		c.setGangWaiting(members, true)
		return nil
	}
	return c.decideGang(ctx, spec, members, ready, need)
}

// syncSingle places one pod of a gang on its own, as syncPod places pods
// outside gangs, in home's domains.
func (c *Controller) syncSingle(ctx context.Context, key string, pod *corev1.Pod, home gangHome) error {
	pc := c.collectClaims(ctx, pod)
	var pending []*planner.Claim
	for _, ic := range pc.ours {
		if ic.Claim.Status.Allocation == nil {
			pending = append(pending, ic)
		}
	}
	if len(pending) == 0 || pc.broken != nil || pc.notReady != "" {
		// syncPod handles these cases; it comes back with the claims'
		// updates.
		return nil
	}
	return c.allocatePodNear(ctx, key, pod, pc, pending, home)
}

// gangEvent records an event on every gated (or refused) pod of the gang.
func (c *Controller) gangEvent(members []*gangMember, eventType, reason, action, note string) {
	for _, m := range members {
		if m.gated() || m.refused {
			c.explain.event(m.pod, nil, eventType, reason, action, note)
		}
	}
}

// setGangWaiting marks the gang's gated pods as waiting (retried on
// cluster changes) or not.
func (c *Controller) setGangWaiting(members []*gangMember, waiting bool) {
	for _, m := range members {
		c.setWaiting(m.key, waiting && (m.gated() || m.refused))
	}
}

// enqueueGang queues every pod of a gang.
func (c *Controller) enqueueGang(gangKey string) {
	objs, err := c.podIdx.ByIndex(podGangIndex, gangKey)
	if err != nil {
		return
	}
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			c.podQueue.Add(pod.Namespace + "/" + pod.Name)
		}
	}
}

// onPodGroup queues the pods of a PodGroup that was created or changed.
func (c *Controller) onPodGroup(obj any) {
	pg, ok := deletedObject[*schedulingv1beta1.PodGroup](obj)
	if !ok {
		return
	}
	key := gangs.Ref{Namespace: pg.Namespace, Name: pg.Name, Source: gangs.SourcePodGroup}.Key()
	// The PodGroup is not part of the gang's fingerprint: evaluate anew.
	c.gangRuns.waitedAt(key, 0, false)
	c.enqueueGang(key)
}

// PodGroupsServed tells whether the API server serves PodGroups
// (scheduling.k8s.io/v1beta1, feature gate GenericWorkload), for
// GangConfig.PodGroups.
func PodGroupsServed(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(schedulingv1beta1.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", schedulingv1beta1.SchemeGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "podgroups" {
			return true, nil
		}
	}
	return false, nil
}
