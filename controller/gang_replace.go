package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
)

// A gang's pod that kube-scheduler refused after it was ungated.
//
// Once a gang's pods are ungated, kube-scheduler binds them. When it
// cannot bind one on the node its claims are allocated on (CPU taken
// meanwhile, a node taint), its DRA plugin deallocates the claims, or the
// controller releases them (checkUnschedulable), and the node is excluded
// for the pod (onDeallocated). The pod cannot be gated again (the API
// only removes scheduling gates). What happens next depends on whether
// any pod of its gang is bound:
//
//   - Some are: they may run already, and are never moved. The refused
//     pod alone is placed again as close to its gang's placed pods as it
//     fits (gang_home.go, as a pod joining a running gang is): under a
//     Required level, a ComputeDomain gang's clique included, no wider
//     than that level's domain. A GangPodReplaced event on the pod names
//     the domains.
//   - None is, and another unbound pod still holds its allocation: that
//     pod is being bound, or was refused too and is about to lose it
//     (kube-scheduler's gang scheduling refuses every pod of a PodGroup
//     when one cannot be placed). The refused pod waits for either.
//   - None is, and none holds an allocation (the whole PodGroup was
//     refused and its claims released): placing each pod on its own would
//     ignore the gang's level and could again hold part of it, which
//     kube-scheduler's gang then refuses. The gang is decided afresh, all
//     or nothing, as a gated gang is (decideGang), within its level, away
//     from the nodes its pods were refused on (refusedExclusions); when it
//     fits only with those nodes, they are tried again, as for a single
//     pod whose every node is excluded.

// replaceGangPod places again an ungated pod of a gang whose gpulink
// claims lost their allocation.
func (c *Controller) replaceGangPod(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref, pc podClaims, pending []*planner.Claim) error {
	logger := klog.FromContext(ctx).WithValues("gang", ref.Key())
	spec, isGang, notReady, err := c.gangSpec(ref, pod)
	if err != nil || notReady != "" || !isGang {
		return c.allocatePod(ctx, key, pod, pc, pending)
	}
	members := c.gangMembers(ctx, ref)
	if !slices.ContainsFunc(members, func(m *gangMember) bool { return m.pod.Spec.NodeName != "" }) {
		return c.replaceWholeGang(ctx, key, pod, ref)
	}
	self := &gangMember{pod: pod, key: key, pc: pc, handedOver: true}
	if spec, err = c.computeDomainSpec(spec, append(members, self)); err != nil {
		c.explain.event(pod, nil, corev1.EventTypeWarning, report.ReasonGangWaiting, actionWait, "waiting: "+err.Error())
		c.setWaiting(key, true)
		return nil
	}
	home := c.gangHome(ctx, spec, members)
	if len(home.steps) > 0 {
		msg := fmt.Sprintf("%s: pod %s lost its allocation after it was handed to kube-scheduler; placing it again on its own %s; the gang's other pods are not moved",
			spec.Ref, pod.Name, c.homeWhere(home))
		logger.V(2).Info("Placing a refused gang pod again near its gang's placed pods", "domains", len(home.steps))
		c.explain.event(pod, pending[0].Claim, corev1.EventTypeNormal, report.ReasonGangPodReplaced, actionAllocate, msg)
	}
	return c.allocatePodNear(ctx, key, pod, pc, pending, home)
}

// holdingRecheck is how soon a refused gang pod waiting for another
// unbound pod of its gang to be bound or released looks again.
const holdingRecheck = 5 * time.Second

// replaceWholeGang decides again the gang of a refused pod none of whose
// pods is bound: all of its refused and gated pods at once, or it waits.
func (c *Controller) replaceWholeGang(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref) error {
	return c.inGangRun(ctx, key, ref, func(ctx context.Context) error {
		return c.replaceWholeGangExclusive(ctx, key, pod, ref)
	})
}

func (c *Controller) replaceWholeGangExclusive(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref) error {
	logger := klog.FromContext(ctx)
	spec, isGang, notReady, err := c.gangSpec(ref, pod)
	if err != nil || notReady != "" || !isGang {
		// Changed since replaceGangPod read it: its next sync decides.
		c.podQueue.Add(key)
		return nil
	}
	members := c.gangMembers(ctx, ref)
	var ready []*gangMember
	var holding, bound, notReadyWhy []string
	for _, m := range members {
		switch {
		case m.pod.Spec.NodeName != "":
			bound = append(bound, m.pod.Name)
			continue
		case !m.gated():
			m.pc = c.collectClaims(ctx, m.pod)
			for _, ic := range m.pc.ours {
				if ic.Claim.Status.Allocation == nil && !c.ledger.InFlight(ic.Claim.UID) {
					m.pending = append(m.pending, ic)
				} else {
					m.allocated = append(m.allocated, ic)
				}
			}
			if len(m.allocated) > 0 {
				holding = append(holding, m.pod.Name)
				continue
			}
			m.refused = len(m.pending) > 0
		}
		switch {
		case !m.ready():
			why := m.pc.notReady
			if m.pc.broken != nil {
				why = m.pc.broken.Error()
			}
			notReadyWhy = append(notReadyWhy, fmt.Sprintf("pod %s: %s", m.pod.Name, why))
		case len(m.pending) > 0 && len(m.allocated) == 0:
			ready = append(ready, m)
		}
	}
	if len(bound) > 0 {
		// Bound meanwhile: placed within its pods' domain.
		c.podQueue.Add(key)
		return nil
	}
	if len(holding) > 0 {
		msg := fmt.Sprintf("waiting: %s: pod %s lost its allocation after it was handed to kube-scheduler while pod(s) %s of its gang, not bound, still hold theirs: placed again within the gang's domain once one is bound, or with the whole gang once they are released too",
			spec.Ref, pod.Name, strings.Join(holding, ", "))
		logger.V(2).Info("Refused gang pod waits for its gang's other pods", "holding", holding)
		c.explain.event(pod, nil, corev1.EventTypeNormal, report.ReasonGangWaiting, actionWait, msg)
		c.setWaiting(key, true)
		// A release queues the gang (enqueueRefusedGang), a binding does
		// not: looked at again shortly rather than at the next retry of
		// waiting pods.
		c.podQueue.AddAfter(key, holdingRecheck)
		return nil
	}
	if spec, err = c.computeDomainSpec(spec, members); err != nil {
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonGangWaiting, actionWait, "waiting: "+err.Error())
		c.setGangWaiting(members, true)
		return nil
	}
	if len(ready) < spec.MinCount {
		msg := fmt.Sprintf("waiting: %s: no pod of the gang is bound after kube-scheduler refused it; %d of %d pods to place together again exist and are ready", spec.Ref, len(ready), spec.MinCount)
		if len(notReadyWhy) > 0 {
			msg += "; not ready: " + strings.Join(notReadyWhy[:min(3, len(notReadyWhy))], "; ")
		}
		c.gangEvent(members, corev1.EventTypeNormal, report.ReasonGangWaiting, actionWait, msg)
		c.setGangWaiting(members, true)
		return nil
	}
	excluded := c.refusedExclusions(ready)
	msg := fmt.Sprintf("%s: no pod of the gang is bound after kube-scheduler refused it, and none holds an allocation: placing its %d pods again together, all or nothing", spec.Ref, len(ready))
	if spec.Level != "" {
		msg += fmt.Sprintf(", at its %s level %s", spec.Policy, c.levelLabel(spec))
	}
	if excluded.Len() > 0 {
		msg += fmt.Sprintf(", away from the node(s) it was refused on (%s)", strings.Join(sets.List(excluded), ", "))
	}
	logger.V(2).Info("Placing a refused gang again as a whole", "pods", len(ready), "excluded", sets.List(excluded))
	c.explain.event(pod, nil, corev1.EventTypeNormal, report.ReasonGangPodReplaced, actionAllocate, msg)
	return c.decideGang(ctx, spec, members, ready, spec.MinCount)
}

// refusedExclusions are the nodes excluded for the refused pods among
// ready (none for a gang never ungated): the gang's pods are alike, so a
// node one was refused on is avoided for all of them.
func (c *Controller) refusedExclusions(ready []*gangMember) sets.Set[string] {
	var out sets.Set[string]
	for _, m := range ready {
		if !m.refused {
			continue
		}
		if ex := c.excludedNodes(m.pod); ex.Len() > 0 {
			if out == nil {
				out = sets.New[string]()
			}
			out = out.Union(ex)
		}
	}
	return out
}

// forgetRefusals clears the refused pods' exclusions once the gang fits
// only with the nodes excluded (their annotations follow on the pods'
// next sync).
func (c *Controller) forgetRefusals(ctx context.Context, ready []*gangMember, excluded sets.Set[string]) {
	klog.FromContext(ctx).V(2).Info("The refused gang fits only on nodes it was refused on; trying them again", "excluded", sets.List(excluded))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range ready {
		if m.refused {
			c.excluded[m.pod.UID] = sets.New[string]()
		}
	}
}

// levelLabel names the gang's level for messages: "leaf" or the key.
func (c *Controller) levelLabel(spec gangs.Spec) string {
	if level, ok := c.hierarchy.LevelOfKey(spec.Level); ok {
		return c.hierarchy.Name(level)
	}
	return spec.Level
}
