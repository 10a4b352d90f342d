package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// allocatedClaims are the pod's claims (any driver) already allocated.
func (m *gangMember) allocatedClaims() []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, cl := range m.pc.all {
		if cl.Status.Allocation != nil {
			out = append(out, cl)
		}
	}
	return out
}

// gangDecision is a gang placed and assumed, to be written.
type gangDecision struct {
	placement *gang.Placement
	pods      []gangPodWrite
}

// gangPodWrite is one pod of a gang decision.
type gangPodWrite struct {
	m      *gangMember
	plan   *planner.Plan
	writes []pendingWrite
}

// decideGang places the ready pods of a gang all at once or not at all.
// Under the decision lock: the node filter and the planner give each
// candidate node's slots (how many of the gang's pods fit there at once,
// trialSlots), driver/gang chooses one node per pod at the lowest level,
// and every pod's claims are planned on its node and assumed in the
// ledger. Any pod that does not fit drops every assumption: no partial
// allocation is held while a gang waits. The writes then follow, all
// claims of all pods before any gate is removed (writeGang).
func (c *Controller) decideGang(ctx context.Context, spec gangs.Spec, members, ready []*gangMember, need int) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	rep := gangRepresentative(ready)
	own, err := planner.PodPlacement(rep.pod, rep.pending)
	if err == nil {
		err = planner.MIGMixError(rep.pending)
	}
	if err != nil {
		c.metrics.Decisions.WithLabelValues(OutcomeInvalid).Inc()
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonUninterpretable, actionAllocate, fmt.Sprintf("%s: pod %s: %v", spec.Ref, rep.pod.Name, err))
		c.setGangWaiting(members, true)
		return nil
	}
	gpus := planner.WholeGPUs(rep.pending)
	req, err := c.gangRequest(spec, len(ready), need, gpus)
	if err != nil {
		c.metrics.Decisions.WithLabelValues(OutcomeInvalid).Inc()
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonUninterpretable, actionAllocate, err.Error())
		c.setGangWaiting(members, true)
		return nil
	}

	c.decideMu.Lock()
	for _, m := range ready {
		for _, ic := range m.pending {
			if c.ledger.Held(ic.Claim.UID) {
				c.decideMu.Unlock()
				logger.V(4).Info("Claim of a gang pod decided meanwhile; waiting for its update", "claim", klog.KObj(ic.Claim))
				return nil
			}
		}
	}
	c.gangDemand.Record(spec.Key(), need, gpus)
	req.Demand = c.gangDemand.Shapes()
	ask := gangAsk{spec: spec, rep: rep, ready: ready, own: own, req: &req, heldOff: new(bool)}
	var home gangHome
	if need < spec.MinCount {
		// Some pods of the gang are placed already (it lost pods and
		// these replace them): the others go as close to them as they
		// fit (gang_home.go).
		home = c.gangHome(ctx, spec, members)
		ask.rail = home.rail
	}
	c.gangRuns.count(&c.gangRuns.decisions, spec.Key())
	dec, nodes, rej, step, perr := c.placeGangNear(ctx, ask, home)
	if perr != nil && !errors.Is(perr, gang.ErrInvalid) && ask.mayGainPastReservation() {
		// It fits nowhere else: a soft reservation lets it onto the
		// reserved domain (gang_reserve_soft.go). When it does not fit
		// there either, the first attempt's nodes stay what it would
		// reserve from.
		c.pastSoftReservation(spec.Key(), func() {
			if d2, n2, r2, s2, err2 := c.placeGangNear(ctx, ask, home); err2 == nil {
				dec, nodes, rej, step, perr = d2, n2, r2, s2, nil
				logger.V(2).Info("Gang placed on a domain another gang reserves softly: it fits nowhere else")
			}
		})
	}
	if perr != nil {
		c.decideMu.Unlock()
		c.metrics.Decisions.WithLabelValues(OutcomeWaiting).Inc()
		msg := "waiting: " + perr.Error() + gangWaitNote(spec, req)
		if home.required && len(home.steps) > 0 {
			last := home.steps[len(home.steps)-1]
			msg += fmt.Sprintf("; %d of its pods are placed already, so the other %d must go to the %s they share (%d nodes)",
				home.placed, need, c.hierarchy.Name(last.level), len(last.nodes))
		}
		if ask.rail != "" {
			msg += fmt.Sprintf("; its pods placed before use NIC rails %s, and so must the others", ask.rail)
		}
		if rej != "" {
			msg += " (" + rej + ")"
		}
		if errors.Is(perr, gang.ErrInvalid) {
			c.gangEvent(members, corev1.EventTypeWarning, report.ReasonUninterpretable, actionAllocate, msg)
		} else {
			c.gangEvent(members, corev1.EventTypeWarning, report.ReasonGangWaiting, actionWait, msg)
			c.considerReserving(ctx, spec, members, req, nodes)
		}
		logger.V(2).Info("Gang waiting", "reason", msg)
		c.setGangWaiting(members, true)
		return nil
	}
	c.metrics.PlanLatency.Observe(time.Since(start).Seconds())
	c.decideMu.Unlock()

	if err := c.writeGang(ctx, spec, dec); err != nil {
		c.metrics.Decisions.WithLabelValues(OutcomeError).Inc()
		return err
	}
	c.releaseReservation(spec.Key())
	c.setGangWaiting(members, false)
	p := dec.placement
	homeNote, relaxedNote := "", ""
	if home.placed > 0 {
		span := home.span(c, p.Nodes)
		homeNote, relaxedNote = home.placedNote(c, step, span), home.relaxedNote(c, span)
	}
	where := fmt.Sprintf("level %s", p.LevelName)
	if p.Domain != "" {
		where += " " + p.Domain
	}
	if p.Alignment != "" {
		where += ", NIC rails " + p.Alignment
	}
	logger.Info("Placed gang", "pods", len(dec.pods), "level", p.LevelName, "domain", p.Domain, "relaxed", p.Relaxed, "duration", time.Since(start))
	c.metrics.GangsPlaced.WithLabelValues(p.LevelName).Inc()
	c.metrics.GangWait.Observe(time.Since(oldestCreation(members)).Seconds())
	for _, pw := range dec.pods {
		c.metrics.Decisions.WithLabelValues(OutcomeAllocated).Inc()
		c.metrics.AllocationLatency.Observe(time.Since(pw.m.pod.CreationTimestamp.Time).Seconds())
		note := fmt.Sprintf("%s: %d pods placed together, spanning %s; this pod: %s", spec.Ref, len(dec.pods), where, pw.plan.Summarize())
		note += homeNote
		c.explain.event(pw.m.pod, pw.writes[0].ic.Claim, corev1.EventTypeNormal, report.ReasonGangPlaced, actionAllocate, note)
		switch {
		case relaxedNote != "":
			c.explain.rec.Eventf(pw.m.pod, nil, corev1.EventTypeWarning, report.ReasonGangRelaxed, actionAllocate, "%s", relaxedNote)
		case p.Relaxed && spec.Level != "":
			c.explain.rec.Eventf(pw.m.pod, nil, corev1.EventTypeWarning, report.ReasonGangRelaxed, actionAllocate, "%s", p.Note)
		}
	}
	c.metrics.DecisionLatency.Observe(time.Since(start).Seconds())
	var errs []error
	for _, pw := range dec.pods {
		if err := c.handOver(ctx, pw.m.pod, pw.m.allocatedClaims()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// gangAsk is what placeGang places.
type gangAsk struct {
	spec gangs.Spec
	// rep is the pod the slots are counted for (gangRepresentative: the
	// one asking the most GPUs), own its placement policy.
	rep   *gangMember
	own   planner.Placement
	ready []*gangMember
	req   *gang.Request
	// within are the only nodes the pods may go to (nil: any): a domain
	// the gang's placed pods share (gangHome).
	within sets.Set[string]
	// rail is the NIC rail key the pods must use (empty: any): the one
	// an aligned gang's placed pods use.
	rail string
	// heldOff, when set, is made true by any candidate pass that turned
	// down a node only for another gang's reservation: a placement past
	// a soft reservation can differ only then (nil: unknown, try it).
	heldOff *bool
}

// mayGainPastReservation tells whether placing the gang again past a
// soft reservation could find more than its passes so far did.
func (a gangAsk) mayGainPastReservation() bool { return a.heldOff == nil || *a.heldOff }

// placeGangNear is placeGang in each of home's domains in turn, tightest
// first, until the pods fit: the index of the step that held them, or of
// the last one tried. An invalid request is not tried further.
func (c *Controller) placeGangNear(ctx context.Context, ask gangAsk, home gangHome) (*gangDecision, []gang.Node, string, int, error) {
	steps := home.tryOrder(c.hierarchy.Cluster())
	var (
		dec   *gangDecision
		nodes []gang.Node
		rej   string
		err   error
		i     int
	)
	excluded := c.refusedExclusions(ask.ready)
	for ; i < len(steps); i++ {
		ask.within = home.within(i)
		if ask.within != nil && i < len(steps)-1 && excluded.Len() > 0 {
			// The nodes the pods were refused on are tried again only
			// when nothing else fits (placeGang), which is for the last
			// step to find, not a tighter one.
			if ask.within = ask.within.Difference(excluded); ask.within.Len() == 0 {
				continue
			}
		}
		if dec, nodes, rej, err = c.placeGang(ctx, ask); err == nil || errors.Is(err, gang.ErrInvalid) {
			break
		}
	}
	return dec, nodes, rej, min(i, len(steps)-1), err
}

// placeGang is the part of a gang decision taken under the decision
// lock: the candidate nodes with their slots, driver/gang's placement,
// and every pod planned and assumed on its node (assumeGang). It returns
// the candidates and the node filter's summary for the waiting message.
// Pods claiming ComputeDomain channels bound each node's slots by its
// free channels (boundByChannels). ask.req.AlignRails is set here, after
// the rails of the candidates are known, so the caller's waiting note can
// name them.
func (c *Controller) placeGang(ctx context.Context, ask gangAsk) (*gangDecision, []gang.Node, string, error) {
	spec, rep, ready, own, req := ask.spec, ask.rep, ask.ready, ask.own, ask.req
	c.gangRuns.count(&c.gangRuns.placements, spec.Key())
	excluded := c.refusedExclusions(ready)
	place := func(excluded sets.Set[string]) (*gang.Placement, []gang.Node, string, error) {
		q := candidateQuery{rep: rep, own: own, maxPods: len(ready), excluded: excluded, within: ask.within, alignRails: spec.AlignRails, heldOff: ask.heldOff}
		if spec.AlignRails && ask.rail == "" {
			q.firstRails = map[string]string{}
		}
		nodes, rej := c.gangCandidates(ctx, q)
		c.boundByChannels(ctx, ready, nodes)
		if spec.AlignRails {
			req.AlignRails = c.railSlots(ctx, railAsk{rep: rep, own: own, fixed: ask.rail, firstRails: q.firstRails}, nodes)
		}
		placement, err := gang.Place(c.hierarchy, *req, nodes)
		return placement, nodes, rej, err
	}
	placement, nodes, rej, err := place(excluded)
	if err != nil && excluded.Len() > 0 {
		// As for a single pod whose every node is excluded: the nodes
		// kube-scheduler refused the gang on are tried again rather
		// than the gang waiting for ever (gang_replace.go).
		if p2, n2, r2, err2 := place(nil); err2 == nil {
			placement, nodes, rej, err = p2, n2, r2, nil
			c.forgetRefusals(ctx, ready, excluded)
			excluded = nil
		}
	}
	if err != nil {
		return nil, nodes, rej, err
	}
	if placement.Level > 0 && ask.mayGainPastReservation() {
		rails := req.AlignRails
		if dec, n2, r2, ok := c.lowerPastSoftReservation(ctx, gangRetry{ask: ask, level: placement.Level, place: func() (*gang.Placement, []gang.Node, string, error) {
			return place(excluded)
		}}); ok {
			return dec, n2, r2, nil
		}
		req.AlignRails = rails
	}
	dec, err := c.assumeGang(ctx, spec, ready, own, placement)
	return dec, nodes, rej, err
}

// assumeGang plans each pod's claims on the node the placement gave it
// and assumes them; when one pod does not fit (the gang's pods differ from
// the representative, or a selector rules the node out), every assumption
// is dropped and the error says which pod.
func (c *Controller) assumeGang(ctx context.Context, spec gangs.Spec, ready []*gangMember, own planner.Placement, p *gang.Placement) (*gangDecision, error) {
	dec := &gangDecision{placement: p}
	undo := func() { c.dropGang(dec) }
	now := metav1.Now()
	for i, node := range p.Nodes {
		if i >= len(ready) {
			break
		}
		m := ready[i]
		pol, err := planner.PodPlacement(m.pod, m.pending)
		if err != nil {
			pol = own
		}
		release := c.holdOffRails(node, p.Alignment)
		d := c.planner.Decide(ctx, planner.Request{Pod: m.pod, Pending: m.pending, Allocated: m.allocatedClaims(), Placement: pol, Only: node})
		release()
		if d.Chosen == nil {
			undo()
			return nil, fmt.Errorf("%s: pod %s does not fit on node %s where the gang's placement put it (%s); the gang's pods are planned by the first one's claims, so give them alike claims",
				spec.Ref, m.pod.Name, node, c.planner.WaitingMessage(m.pending, d))
		}
		pw := gangPodWrite{m: m, plan: d.Chosen}
		for j, ic := range m.pending {
			alloc, uses := buildAllocation(ic, d.Chosen.Node, d.Chosen.Claims[j], d.Chosen.ForeignResults(j), now)
			settle, ok := c.ledger.Assume(ic.Claim.UID, uses)
			if !ok {
				dec.pods = append(dec.pods, pw)
				undo()
				return nil, fmt.Errorf("%s: claim %s/%s was decided by another pod during this decision", spec.Ref, ic.Claim.Namespace, ic.Claim.Name)
			}
			pw.writes = append(pw.writes, pendingWrite{ic: ic, alloc: alloc, settle: settle})
		}
		c.fit.Assume(m.pod, node)
		c.planner.Record(ctx, m.pod, d.Chosen)
		dec.pods = append(dec.pods, pw)
	}
	return dec, nil
}

// dropGang drops every assumption of a gang decision not written.
func (c *Controller) dropGang(dec *gangDecision) {
	for _, pw := range dec.pods {
		for _, w := range pw.writes {
			w.settle("", false)
		}
		c.fit.Unassume(pw.m.pod.UID)
	}
}
