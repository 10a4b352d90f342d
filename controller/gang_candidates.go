package controller

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/gang"
)

// candidateQuery asks gangCandidates for the nodes of a gang's pods.
type candidateQuery struct {
	// rep is the pod whose copies are counted, own its placement policy.
	rep *gangMember
	own planner.Placement
	// maxPods bounds each node's slots.
	maxPods int
	// alignRails is the gang's gang-rails: aligned: its slots are
	// counted per rail key (railSlots), and bounded here by the free NICs
	// of one rail (railSlotBound).
	alignRails bool
	// firstRails, when not nil, gets the rail key of the first copy on
	// each node planner.Slots counts, planned now or kept ("" where it
	// has none), for discoverRailKeys.
	firstRails map[string]string
	// excluded are nodes kube-scheduler refused the gang's pods on
	// (refusedExclusions; nil for a gang never ungated).
	excluded sets.Set[string]
	// heldOff, when not nil, is set when the filter turned a node down
	// only for another gang's reservation (gangAsk.heldOff).
	heldOff *bool
	// within are the only nodes considered (nil: all).
	within sets.Set[string]
}

// gangCandidates returns the nodes the gang's representative pod may run
// on, with their slots: how many of the gang's pods fit there at once.
// The planner counts the slots of the usual pods itself (planner.Slots,
// which keeps each node's count until the node changes, and counts NICs
// beside the GPUs too); for the others (MIG, shares, pod affinity) each
// node's copies are tried one by one (trialSlots). The second result
// summarizes the nodes the filter turned down.
func (c *Controller) gangCandidates(ctx context.Context, q candidateQuery) ([]gang.Node, string) {
	logger := klog.FromContext(ctx)
	rep, own, maxPods := q.rep, q.own, q.maxPods
	all := c.inv.All()
	if q.within != nil {
		all = slices.DeleteFunc(all, func(n *planner.NodeInventory) bool { return !q.within.Has(n.Node) })
	}
	if q.alignRails {
		maxPods = c.railSlotBound(rep, all, maxPods)
	}
	cands, objs, rej := c.filter.CandidateNodes(logger, rep.pod, all, rep.allocatedClaims(), q.excluded)
	if q.heldOff != nil && rej.HeldOffByReservation() {
		*q.heldOff = true
	}
	sreq := planner.SlotRequest{Pod: rep.pod, Pending: rep.pending, Placement: own, Nodes: cands, Objects: objs, Max: maxPods}
	if q.firstRails != nil {
		sreq.FirstForeign = func(i int, devices []planner.DeviceKey, _ bool) {
			k, _ := railKeyOf(devices, c.railsOn(cands[i].Node))
			q.firstRails[cands[i].Node] = k
		}
	}
	counted, ok := c.planner.Slots(ctx, sreq)
	out := make([]gang.Node, 0, len(cands))
	for i, n := range cands {
		node := objs[i]
		var s planner.NodeSlots
		if ok {
			s = counted[i]
		} else {
			s.Slots = c.trialSlots(ctx, rep, own, n.Node, maxPods)
			s.FreeGPUs, s.TotalGPUs = c.planner.GPUCounts(n.Node)
		}
		out = append(out, gang.Node{Name: n.Node, Domains: c.withPublishedClique(c.gangDomains.of(c.hierarchy, node), n), Slots: s.Slots, FreeGPUs: s.FreeGPUs, TotalGPUs: s.TotalGPUs})
	}
	c.gangDomains.prune(objs)
	summary := ""
	if rej != nil && len(cands) < len(all) {
		summary = fmt.Sprintf("%d of %d nodes turned down for the pods: %s", len(all)-len(cands), len(all), rej.Reasons())
	}
	return out, summary
}

// nodeDomains keeps each node's domains in the gang hierarchy, computed
// once per Node object (the informer replaces the object on any change of
// its labels) rather than once per node and gang decision. Used under the
// decision lock.
type nodeDomains struct {
	byNode map[*corev1.Node][]string
}

// prune forgets the Node objects no longer current, once they could make
// up half of the map (objs: the current ones of this decision).
func (d *nodeDomains) prune(objs []*corev1.Node) {
	if len(d.byNode) <= 2*len(objs)+64 {
		return
	}
	keep := make(map[*corev1.Node][]string, len(objs))
	for _, n := range objs {
		if doms, ok := d.byNode[n]; ok {
			keep[n] = doms
		}
	}
	d.byNode = keep
}

// of returns the node's domains (gang.Hierarchy.Domains); they are shared,
// read-only.
func (d *nodeDomains) of(h *gang.Hierarchy, node *corev1.Node) []string {
	if doms, ok := d.byNode[node]; ok {
		return doms
	}
	if d.byNode == nil {
		d.byNode = map[*corev1.Node][]string{}
	}
	doms := h.Domains(node.Labels)
	d.byNode[node] = doms
	return doms
}

// trialSlots counts how many copies of the representative pod fit on the
// node at once (planCopies). Called under the decision lock.
func (c *Controller) trialSlots(ctx context.Context, rep *gangMember, own planner.Placement, node string, maxPods int) int {
	return c.planCopies(ctx, rep, own, node, maxPods, nil)
}

// planCopies plans copies of the representative pod on the node one after
// the other: each plan's devices are assumed in the ledger (and the pod in
// the node fit) under trial identities before the next copy is planned,
// until one no longer fits or maxPods were planned. visit (if not nil)
// sees each plan. It returns how many were planned. Every trial
// assumption is dropped before returning. Called under the decision lock,
// so no other decision sees them.
func (c *Controller) planCopies(ctx context.Context, rep *gangMember, own planner.Placement, node string, maxPods int, visit func(*planner.Plan)) int {
	var settles []func(string, bool)
	var fakes []types.UID
	defer func() {
		for _, s := range settles {
			s("", false)
		}
		for _, uid := range fakes {
			c.fit.Unassume(uid)
		}
	}()
	// A node with F free GPUs holds at most F/g pods of g whole GPUs: no
	// planning beyond that bound (nor on a node below one pod), which
	// spares most nodes the planning that fails.
	if g := planner.WholeGPUs(rep.pending); g > 0 {
		free, _ := c.planner.GPUCounts(node)
		maxPods = min(maxPods, free/g)
	}
	now := metav1.Now()
	allocated := rep.allocatedClaims()
	planned := 0
	for planned < maxPods {
		trial := rep.pod
		if planned > 0 {
			// Its own identity, not that of a copy assumed before it:
			// the fit filter does not count the pod it decides on the
			// node, so the copy would not count.
			trial = rep.pod.DeepCopy()
			trial.UID = types.UID(fmt.Sprintf("gang-trial/%s/next", rep.pod.UID))
		}
		d := c.planner.Decide(ctx, planner.Request{Pod: trial, Pending: rep.pending, Allocated: allocated, Placement: own, Only: node})
		if d.Chosen == nil {
			break
		}
		planned++
		if visit != nil {
			visit(d.Chosen)
		}
		if planned == maxPods {
			break
		}
		for i, ic := range rep.pending {
			_, uses := buildAllocation(ic, d.Chosen.Node, d.Chosen.Claims[i], d.Chosen.ForeignResults(i), now)
			settle, ok := c.ledger.Assume(types.UID(fmt.Sprintf("gang-trial/%s/%s/%d", ic.Claim.UID, node, planned)), uses)
			if ok {
				settles = append(settles, settle)
			}
		}
		fake := rep.pod.DeepCopy()
		fake.UID = types.UID(fmt.Sprintf("gang-trial/%s/%d", rep.pod.UID, planned))
		c.fit.Assume(fake, node)
		fakes = append(fakes, fake.UID)
	}
	return planned
}
