package planner

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// MIG placement. A pod whose pending claims ask for MIG devices (requests
// on a class labelled MIGLabel) is placed here, its MIG claims apart from
// the whole-GPU and share allocator: MIG devices have no position in a node's link
// topology and are only ever given out each whole, to one claim. The
// ledger counts them like any exclusive device (by pool and device name),
// so a MIG device is given once, whoever allocated it.
//
// Among the free MIG devices that match a request, one at a time:
//  1. those whose GPU already has allocated MIG devices (this plan's
//     included) first: packing keeps other GPUs' devices, and with them
//     the large profiles, free;
//  2. then the smallest placement (memory slices), then the least memory:
//     a request that a 1g device satisfies never takes a 3g one;
//  3. then GPU index, placement start and device name, so that equal
//     decisions are reproducible.
//
// Partitions of GPUs partitioned on demand (MIG on demand,
// inventory_ondemand.go) come after the MIG devices that exist: a free
// existing device costs nothing, a partition rules out those it overlaps.
// A partition is free when no claim holds it and it fits beside the
// partitions its GPU's claims hold (mig.Table.Fits, the counters' rule);
// among the free ones that match, mig.Choose with mig.LookAhead takes the
// one that keeps the largest profiles possible (see driver/mig/place.go),
// and the result says which placement and why (PlacedResult.Placed).
//
// Nodes are ranked by fewest firstAvailable fallbacks, then the headroom
// their partitions cost (least, largest sizes first), then the devices
// placed on already busy GPUs (more first), then the memory slices taken
// (fewer first), then node name. A pod that also has claims of whole GPUs
// or shares gets them on the same node from planNode, and its nodes are
// ranked by those (choosePlan).

// migMixError refuses a claim whose requests (or a request whose
// firstAvailable alternatives) mix MIG device classes with whole-GPU or
// share classes: MIG devices and GPUs are placed by different planners,
// claim by claim. A pod may have claims of both kinds.
func MIGMixError(pending []*Claim) error {
	for _, ic := range pending {
		var migReqs, other []string
		for _, r := range ic.Requests {
			hasMIG, hasOther := false, false
			for _, alt := range r.Alternatives {
				if alt.MIG {
					hasMIG = true
				} else {
					hasOther = true
				}
			}
			switch {
			case hasMIG && hasOther:
				return fmt.Errorf("claim %s/%s, request %s: its firstAvailable alternatives mix MIG device classes with whole-GPU or share classes; gpulink places MIG devices apart from whole GPUs, so put them in separate claims",
					ic.Claim.Namespace, ic.Claim.Name, r.Name)
			case hasMIG:
				migReqs = append(migReqs, r.Name)
			default:
				other = append(other, r.Name)
			}
		}
		if len(migReqs) > 0 && len(other) > 0 {
			return fmt.Errorf("claim %s/%s asks for MIG devices (requests %s) and for whole GPUs or shares (requests %s) together; gpulink places MIG devices apart from whole GPUs, so put them in separate claims (one pod may use both)",
				ic.Claim.Namespace, ic.Claim.Name, strings.Join(migReqs, ","), strings.Join(other, ","))
		}
	}
	return nil
}

// isMIGClaim tells whether a claim asks for MIG devices (after
// migMixError: all its requests do).
func isMIGClaim(ic *Claim) bool {
	for _, r := range ic.Requests {
		for _, alt := range r.Alternatives {
			if alt.MIG {
				return true
			}
		}
	}
	return false
}

// wantsMIG tells whether the pending claims ask for MIG devices.
func wantsMIG(pending []*Claim) bool {
	for _, ic := range pending {
		for _, r := range ic.Requests {
			for _, alt := range r.Alternatives {
				if alt.MIG {
					return true
				}
			}
		}
	}
	return false
}

// migPlan is a nodePlan of MIG devices with what ranks it.
type migPlan struct {
	plan *Plan
	// packed counts the devices placed on GPUs that already had
	// allocated MIG devices; slices sums their memory slices.
	packed, slices int
	// loss sums the headroom its partitions cost their GPUs (mig.Choose).
	loss mig.Headroom
}

// migPlacer places MIG requests on one node.
type migPlacer struct {
	ctx  context.Context
	sel  *SelectorEvaluator
	node *NodeInventory
	// used marks the node's MIG devices (by position in node.MIG) held by
	// the ledger or by this plan; busy counts them per parent GPU index.
	used []bool
	busy map[int]int
	// od is the state of each GPU partitioned on demand (by position in
	// node.OnDemand): the partitions held by the ledger or this plan.
	od []mig.State
	// loss sums the headroom the partitions placed cost their GPUs.
	loss     mig.Headroom
	packed   int
	slices   int
	attempts int
	why      []string
}

func (p *migPlacer) note(format string, args ...any) {
	if len(p.why) < 8 {
		p.why = append(p.why, fmt.Sprintf(format, args...))
	}
}

// planMIGNode places every pending claim on one node's MIG devices, or
// explains why not. used is the node's MIG usage from the ledger.
func planMIGNode(ctx context.Context, sel *SelectorEvaluator, n *NodeInventory, used []bool, claims []*Claim) (*migPlan, []string) {
	if len(n.MIG) == 0 {
		return nil, []string{fmt.Sprintf("node %s has no MIG devices", n.Node)}
	}
	p := &migPlacer{ctx: ctx, sel: sel, node: n, used: slices.Clone(used), busy: map[int]int{}}
	p.od = make([]mig.State, len(n.OnDemand))
	for i, u := range p.used {
		if u {
			d := n.MIG[i]
			p.busy[d.Parent]++
			if d.OnDemand != nil {
				p.od[d.ODPos] = d.OnDemand.Table.Add(p.od[d.ODPos], d.Part)
			}
		}
	}
	plan := &Plan{Node: n}
	for _, ic := range claims {
		res, ok := p.place(ic, 0, make([]string, len(ic.Constraints)), nil)
		if !ok {
			return nil, p.why
		}
		for _, r := range res {
			plan.RankSum += r.Alt.Rank
		}
		plan.Claims = append(plan.Claims, res)
	}
	return &migPlan{plan: plan, packed: p.packed, slices: p.slices, loss: p.loss}, nil
}

// place places requests i.. of a claim, backtracking over alternatives and
// matchAttribute groups as placer.placeFrom does.
func (p *migPlacer) place(ic *Claim, i int, bound []string, placed []PlacedResult) ([]PlacedResult, bool) {
	if i == len(ic.Requests) {
		return placed, true
	}
	for _, alt := range ic.Requests[i].Alternatives {
		if !alt.MIG {
			// migMixError keeps such claims out; never hand a whole-GPU
			// or share request a MIG device.
			p.note("request %s: not a MIG request", alt.ResultName)
			continue
		}
		matching, free := p.eligible(alt)
		if matching == nil {
			continue
		}
		if alt.All && slices.ContainsFunc(matching, func(m int) bool { return p.node.MIG[m].OnDemand != nil }) {
			p.note("request %s: allocationMode All matches partitions of GPUs partitioned on demand on node %s, which overlap one another; ask for a count", alt.ResultName, p.node.Node)
			continue
		}
		if alt.All {
			for _, m := range matching {
				if p.used[m] {
					p.note("request %s: allocationMode All, but MIG device %s on node %s is in use", alt.ResultName, p.node.MIG[m].Name, p.node.Node)
					free = nil
					break
				}
			}
			if free == nil {
				continue
			}
		}
		for _, g := range p.groups(ic, alt, free, bound) {
			if p.attempts >= maxAttemptsPerNode {
				p.note("gave up after %d placement attempts on node %s", maxAttemptsPerNode, p.node.Node)
				return nil, false
			}
			p.attempts++
			want := alt.Count
			if alt.All {
				want = len(g.devs)
			}
			if len(g.devs) < want {
				p.note("request %s: %d free MIG devices on node %s match it%s, it wants %d", alt.ResultName, len(g.devs), p.node.Node, g.label, want)
				continue
			}
			savedPacked, savedSlices, savedLoss := p.packed, p.slices, p.loss
			picked, why, ok := p.pick(g.devs, want)
			if !ok {
				p.note("request %s: %d partitions on node %s match it%s, but no %d of them fit side by side beside those allocated", alt.ResultName, len(g.devs), p.node.Node, g.label, want)
				continue
			}
			if all, ok := p.place(ic, i+1, g.bound, append(slices.Clip(placed), PlacedResult{Alt: alt, MIG: picked, Placed: why})); ok {
				return all, true
			}
			for _, d := range picked {
				p.release(d)
			}
			p.packed, p.slices, p.loss = savedPacked, savedSlices, savedLoss
		}
	}
	return nil, false
}

// eligible returns the positions of the node's MIG devices that match the
// alternative's selectors and whose taints it tolerates, and of those the
// free ones; nil (after noting why, naming the request's selectors) when
// none matches.
func (p *migPlacer) eligible(alt *Alternative) (matching, free []int) {
	elig, runtimeErr, err := p.sel.eligibleMIG(p.ctx, p.node, alt.Selectors)
	if err != nil {
		p.note("request %s: %v", alt.ResultName, err)
		return nil, nil
	}
	matching = make([]int, 0, len(p.node.MIG))
	free = make([]int, 0, len(p.node.MIG))
	for i, d := range p.node.MIG {
		if !elig[i] {
			continue
		}
		if t, bad := untolerated(d.scheduling, alt.Tolerations); bad {
			p.note("request %s: MIG device %s on node %s has taint %s=%s:%s, which the request does not tolerate", alt.ResultName, d.Name, p.node.Node, t.Key, t.Value, t.Effect)
			continue
		}
		matching = append(matching, i)
		if !p.used[i] && p.fits(d) {
			free = append(free, i)
		}
	}
	switch {
	case len(matching) == 0:
		msg := fmt.Sprintf("request %s: no MIG device on node %s matches %s", alt.ResultName, p.node.Node, alt.migSelectors())
		if runtimeErr != nil {
			msg += fmt.Sprintf(" (%v)", runtimeErr)
		}
		p.note("%s", msg)
		return nil, nil
	case len(free) == 0 && !alt.All && slices.ContainsFunc(matching, func(m int) bool { return p.node.MIG[m].OnDemand != nil }):
		p.note("request %s: no partition on node %s that matches it fits beside the partitions allocated (%d match; still possible: %s)", alt.ResultName, p.node.Node, len(matching), p.headroomSummary())
	case len(free) == 0 && !alt.All:
		p.note("request %s: every MIG device on node %s that matches it is in use (%d)", alt.ResultName, p.node.Node, len(matching))
	}
	return matching, free
}

// migGroup is a set of free MIG devices an alternative may draw from: the
// devices with one value of each unbound matchAttribute constraint.
type migGroup struct {
	devs  []int
	bound []string
	label string
}

// groups splits the free devices by the claim's matchAttribute values,
// keeping only those that agree with the values bound so far.
func (p *migPlacer) groups(ic *Claim, alt *Alternative, free []int, bound []string) []migGroup {
	byKey := map[string]*migGroup{}
	var order []string
	for _, i := range free {
		d := p.node.MIG[i]
		nb, key, ok := bindConstraints(ic.Constraints, alt.ResultName, bound, func(fq resourceapi.FullyQualifiedName) (resourceapi.DeviceAttribute, bool) {
			return sliceformat.Lookup(d.CEL.Attributes, d.CEL.Driver, fq)
		})
		if !ok {
			continue
		}
		g := byKey[key]
		if g == nil {
			label := ""
			if key != "" {
				label = " with " + key
			}
			g = &migGroup{bound: nb, label: label}
			byKey[key] = g
			order = append(order, key)
		}
		g.devs = append(g.devs, i)
	}
	if len(order) == 0 && len(ic.Constraints) > 0 {
		p.note("request %s: no free MIG device on node %s satisfies the claim's matchAttribute constraints together with the devices already chosen", alt.ResultName, p.node.Node)
	}
	sort.Strings(order)
	out := make([]migGroup, len(order))
	for i, k := range order {
		out[i] = *byKey[k]
	}
	return out
}

// pick takes want devices of devs, one at a time (each pick makes its GPU
// busy for the next), and marks them used: MIG devices that exist by the
// package's order, then partitions by mig.Choose. It says where each
// partition went and why; false (nothing marked) when the partitions
// cannot all be placed side by side.
func (p *migPlacer) pick(devs []int, want int) ([]*migDevice, []string, bool) {
	left := slices.Clone(devs)
	out := make([]*migDevice, 0, want)
	var why []string
	savedPacked, savedSlices, savedLoss := p.packed, p.slices, p.loss
	for range want {
		best := -1
		for j, i := range left {
			if p.node.MIG[i].OnDemand == nil && (best < 0 || p.better(i, left[best])) {
				best = j
			}
		}
		if best < 0 {
			j, note, ok := p.choosePartition(left)
			if !ok {
				for _, d := range out {
					p.release(d)
				}
				p.packed, p.slices, p.loss = savedPacked, savedSlices, savedLoss
				return nil, nil, false
			}
			best = j
			why = append(why, note)
		}
		i := left[best]
		left = slices.Delete(left, best, best+1)
		d := p.node.MIG[i]
		if p.busy[d.Parent] > 0 {
			p.packed++
		}
		p.slices += d.Placement.Size
		p.used[i] = true
		p.busy[d.Parent]++
		if d.OnDemand != nil {
			p.od[d.ODPos] = d.OnDemand.Table.Add(p.od[d.ODPos], d.Part)
		}
		out = append(out, d)
	}
	return out, why, true
}

// fits tells whether a MIG device can be given beside what is held: a
// partition must fit beside its GPU's held partitions.
func (p *migPlacer) fits(d *migDevice) bool {
	return d.OnDemand == nil || d.OnDemand.Table.Fits(p.od[d.ODPos], d.Part)
}

// choosePartition chooses among the partitions of left (positions in
// node.MIG) the one to give next (mig.Choose, look-ahead), returning its
// position in left and the placement's explanation.
func (p *migPlacer) choosePartition(left []int) (int, string, bool) {
	gpus := make([]mig.GPUState, len(p.node.OnDemand))
	for k, od := range p.node.OnDemand {
		gpus[k] = mig.GPUState{Index: od.Index, Table: od.Table, State: p.od[k]}
	}
	cands := make([]mig.Candidate, 0, len(left))
	at := make([]int, 0, len(left))
	for j, i := range left {
		if d := p.node.MIG[i]; d.OnDemand != nil {
			cands = append(cands, mig.Candidate{GPU: d.ODPos, Part: d.Part})
			at = append(at, j)
		}
	}
	ch, ok := mig.Choose(mig.LookAhead, gpus, cands)
	if !ok {
		return 0, "", false
	}
	for k, v := range ch.Before.Minus(ch.After) {
		p.loss[k] += v
	}
	j := at[slices.Index(cands, ch.Candidate)]
	d := p.node.MIG[left[j]]
	return j, fmt.Sprintf("placed %s at memory slice %d of gpu-%d; keeps %s possible there (before: %s)",
		d.Profile, d.Placement.Start, d.Parent, ch.After.Largest(2), ch.Before.Largest(2)), true
}

// headroomSummary says what the node's GPUs partitioned on demand could
// still host, the two largest sizes each, GPUs with the same grouped:
// "gpu-0,gpu-1: a 4g, a 3g; gpu-2: a 7g, a 4g".
func (p *migPlacer) headroomSummary() string {
	var order []string
	byRoom := map[string][]string{}
	for k, od := range p.node.OnDemand {
		room := od.Table.Headroom(p.od[k]).Largest(2)
		if byRoom[room] == nil {
			order = append(order, room)
		}
		byRoom[room] = append(byRoom[room], fmt.Sprintf("gpu-%d", od.Index))
	}
	parts := make([]string, len(order))
	for i, room := range order {
		parts[i] = strings.Join(byRoom[room], ",") + ": " + room
	}
	return strings.Join(parts, "; ")
}

// release undoes pick for one device.
func (p *migPlacer) release(d *migDevice) {
	for i, m := range p.node.MIG {
		if m == d {
			p.used[i] = false
			p.busy[d.Parent]--
			if d.OnDemand != nil {
				p.od[d.ODPos] = d.OnDemand.Table.Remove(p.od[d.ODPos], d.Part)
			}
			return
		}
	}
}

// better tells whether MIG device a ranks before b (see the package order
// above).
func (p *migPlacer) better(a, b int) bool {
	x, y := p.node.MIG[a], p.node.MIG[b]
	if bx, by := p.busy[x.Parent] > 0, p.busy[y.Parent] > 0; bx != by {
		return bx
	}
	if x.Placement.Size != y.Placement.Size {
		return x.Placement.Size < y.Placement.Size
	}
	if x.MemoryBytes != y.MemoryBytes {
		return x.MemoryBytes < y.MemoryBytes
	}
	if x.Parent != y.Parent {
		return x.Parent < y.Parent
	}
	if x.Placement.Start != y.Placement.Start {
		return x.Placement.Start < y.Placement.Start
	}
	return x.Name < y.Name
}
