package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// PlacedResult is one allocation decision for one alternative on a node:
// a set of whole GPUs, or one share on one GPU.
type PlacedResult struct {
	Alt       *Alternative
	Positions []int
	// MIG holds the MIG devices of a MIG request (nodeplan_mig.go); such
	// a result has no Positions.
	MIG []*migDevice
	// Placed says, for each partition of a GPU partitioned on demand in
	// MIG, which placement it got and why (nodeplan_mig.go).
	Placed []string
	// Share is non-nil for a share; Consumed is then what the result's
	// consumedCapacity records, by the device's own capacity names.
	Share    *allocate.ShareRequest
	Consumed map[resourceapi.QualifiedName]resource.Quantity
	Weakest  topology.Link
	Agg      int
	// Req and Eligible are what was asked of the allocator, kept to rank
	// nodes with allocate.ChooseNode.
	Req allocate.Request
}

// nodePlan is the placement of every pending gpulink claim of a pod on one node.
type Plan struct {
	Node   *NodeInventory
	Claims [][]PlacedResult // parallel to the claims planned
	// Foreign are the other drivers' devices of each claim, parallel to
	// Claims where a claim asks for some (foreign_plan.go).
	Foreign [][]ForeignResult
	RankSum int
	// Base is the node's usage before the plan, for ranking.
	Base []allocate.GPUUsage
}

// maxAttemptsPerNode bounds the backtracking over firstAvailable
// alternatives and matchAttribute groups on one node.
const maxAttemptsPerNode = 512

// placer places the requests of claims on one node, on a private copy of
// the node's usage.
type placer struct {
	ctx      context.Context
	sel      *SelectorEvaluator
	pol      allocate.Policy
	node     *NodeInventory
	state    *allocate.NodeState
	attempts int
	// why collects the reasons alternatives failed, for the waiting event.
	why []string
	// shapeFailed is set when a complete placement broke checkShape;
	// mpsPin, when not negative, holds the claim's single MPS shares to
	// that device (placeMPSTogether).
	shapeFailed bool
	mpsPin      int
	// foreign is the node's other drivers' devices, for claims that ask
	// for some (foreign_plan.go); nil where none are planned.
	foreign *foreignNode
	// saved holds, per request depth of placeFrom, the usage an attempt
	// restores when it fails (saveUsage).
	saved [][]allocate.GPUUsage
}

func (p *placer) note(format string, args ...any) {
	if len(p.why) < 8 {
		p.why = append(p.why, fmt.Sprintf(format, args...))
	}
}

// planNode places all claims on one node, in order, or explains why not.
func planNode(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, n *NodeInventory, usage []allocate.GPUUsage, claims []*Claim) (*Plan, []string) {
	return planNodeWith(ctx, sel, pol, n, usage, claims, nil)
}

// planNodeWith is planNode with the node's other drivers' devices.
func planNodeWith(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, n *NodeInventory, usage []allocate.GPUUsage, claims []*Claim, foreign *foreignNode) (*Plan, []string) {
	base := sanitizeUsage(usage)
	p := &placer{ctx: ctx, sel: sel, pol: pol, node: n, mpsPin: -1, foreign: foreign,
		state: &allocate.NodeState{Name: n.Node, Topology: n.Topo, Usage: slices.Clone(base)}}
	plan := &Plan{Node: n, Base: base}
	for _, ic := range claims {
		if !p.foreignEnough(ic) {
			return nil, p.why
		}
		p.shapeFailed = false
		res, ok := p.placeFrom(ic, 0, make([]string, len(ic.Constraints)), nil)
		if !ok && p.shapeFailed {
			res, ok = p.placeMPSTogether(ic)
		}
		if !ok {
			return nil, p.why
		}
		for _, r := range res {
			plan.RankSum += r.Alt.Rank
		}
		plan.Claims = append(plan.Claims, res)
		plan.Foreign = append(plan.Foreign, p.takeForeign())
	}
	return plan, nil
}

// sanitizeUsage makes usage that other allocators produced acceptable to
// the allocator without ever making a device look freer than it is: a
// device held whole is only whole, cores never exceed the device.
func sanitizeUsage(in []allocate.GPUUsage) []allocate.GPUUsage {
	out := slices.Clone(in)
	for i := range out {
		u := &out[i]
		if u.Exclusive {
			*u = allocate.GPUUsage{Exclusive: true}
			continue
		}
		if u.Cores > 100 {
			u.Cores = 100
		}
		if u.Shares < 0 || u.MemoryBytes < 0 || u.Cores < 0 || (u.Shares == 0 && (u.MemoryBytes != 0 || u.Cores != 0 || u.Group != "")) {
			*u = allocate.GPUUsage{Exclusive: true}
		}
	}
	return out
}

// placeFrom places requests i.. of a claim with the constraint values
// bound so far and the results placed so far, backtracking over
// alternatives and attribute groups. It returns all the claim's results.
func (p *placer) placeFrom(ic *Claim, i int, bound []string, placed []PlacedResult) ([]PlacedResult, bool) {
	if i == len(ic.Requests) {
		if err := p.checkShape(placed); err != nil {
			p.note("%s", err.Error())
			p.shapeFailed = true
			return nil, false
		}
		if !p.placeForeign(ic, bound, placed) {
			return nil, false
		}
		return placed, true
	}
	req := ic.Requests[i]
	for _, alt := range req.Alternatives {
		base := p.baseEligible(alt)
		if base == nil {
			continue
		}
		if p.mpsPin >= 0 && alt.Share && alt.Count == 1 && shareStrategy(alt) == v1alpha1.SharingMPS {
			base = slices.Clone(base)
			for pos := range base {
				base[pos] = base[pos] && pos == p.mpsPin
			}
		}
		// Every variant's trial was computed on the current state, and a
		// failed variant restores exactly that state, so placeAlt can
		// commit the trial of each without searching again.
		for _, v := range p.variants(ic, alt, base, bound) {
			if p.attempts >= maxAttemptsPerNode {
				p.note("gave up after %d placement attempts on node %s", maxAttemptsPerNode, p.node.Node)
				return nil, false
			}
			p.attempts++
			saved := p.saveUsage(i)
			savedMax, savedOvercommit := p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent
			res, err := p.placeAlt(alt, v)
			if err == nil {
				if all, ok := p.placeFrom(ic, i+1, v.bound, append(slices.Clip(placed), res...)); ok {
					return all, true
				}
			} else {
				p.note("%s", err.Error())
			}
			p.restoreUsage(saved)
			p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent = savedMax, savedOvercommit
		}
	}
	return nil, false
}

// saveUsage copies the node state's usage aside for an attempt at
// request depth i, into a buffer kept per depth: each attempt at a depth
// saves and restores before the next, and deeper attempts use their own.
// A node's planning tries several variants per request, and each copy was
// an allocation.
func (p *placer) saveUsage(i int) []allocate.GPUUsage {
	for len(p.saved) <= i {
		p.saved = append(p.saved, nil)
	}
	if p.state.Usage == nil {
		return nil
	}
	p.saved[i] = append(p.saved[i][:0], p.state.Usage...)
	return p.saved[i]
}

// restoreUsage puts back the usage saveUsage saved, into the state's own
// slice: the saved buffer stays the depth's.
func (p *placer) restoreUsage(saved []allocate.GPUUsage) {
	if saved == nil {
		p.state.Usage = nil
		return
	}
	p.state.Usage = append(p.state.Usage[:0], saved...)
}

// baseEligible applies selectors, taints and shareability to the node's
// devices. It returns nil (after noting why) when no device qualifies.
func (p *placer) baseEligible(alt *Alternative) []bool {
	elig, runtimeErr, err := p.sel.eligibleBySelectors(p.ctx, p.node, alt.Selectors)
	if err != nil {
		p.note("request %s: %v", alt.ResultName, err)
		return nil
	}
	anyEligible := false
	for pos, d := range p.node.Devices {
		if !elig[pos] {
			continue
		}
		if t, bad := UntoleratedTaint(d, alt.Tolerations); bad {
			elig[pos] = false
			p.note("request %s: device %s on node %s has taint %s=%s:%s, which the request does not tolerate", alt.ResultName, d.Name, p.node.Node, t.Key, t.Value, t.Effect)
			continue
		}
		if alt.Share && !d.AllowMultiple {
			elig[pos] = false
			continue
		}
		anyEligible = true
	}
	if !anyEligible {
		msg := fmt.Sprintf("request %s: no device on node %s matches its class and selectors", alt.ResultName, p.node.Node)
		if runtimeErr != nil {
			msg += fmt.Sprintf(" (%v)", runtimeErr)
		}
		p.note("%s", msg)
		return nil
	}
	return elig
}

// UntoleratedTaint returns a NoSchedule or NoExecute device taint, other
// than gpulink's own managed taint, that the tolerations do not tolerate.
func UntoleratedTaint(d *DeviceInfo, tols []resourceapi.DeviceToleration) (resourceapi.DeviceTaint, bool) {
	for _, t := range sliceformat.SchedulingTaints(d.Taints) {
		if !tolerates(tols, t) {
			return t, true
		}
	}
	return resourceapi.DeviceTaint{}, false
}

// untolerated returns the first of a device's scheduling taints the
// tolerations do not tolerate (UntoleratedTaint, on taints already
// filtered by sliceformat.SchedulingTaints).
func untolerated(scheduling []resourceapi.DeviceTaint, tols []resourceapi.DeviceToleration) (resourceapi.DeviceTaint, bool) {
	for _, t := range scheduling {
		if !tolerates(tols, t) {
			return t, true
		}
	}
	return resourceapi.DeviceTaint{}, false
}

// firstRequest is the allocator request for the alternative's first
// (for whole GPUs: only) placement within a variant.
func (p *placer) firstRequest(alt *Alternative, v variant) allocate.Request {
	if alt.Share {
		return allocate.Request{Share: v.share, Eligible: v.eligible}
	}
	k := alt.Count
	if alt.All {
		k = 0
		for _, e := range v.eligible {
			if e {
				k++
			}
		}
	}
	return allocate.Request{GPUs: k, RequiredLink: alt.RequiredLink, Eligible: v.eligible}
}

// placeAlt allocates and commits one alternative within a variant.
func (p *placer) placeAlt(alt *Alternative, v variant) ([]PlacedResult, error) {
	req := p.firstRequest(alt, v)
	p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent = maxSharesPerGPU(alt), memoryOvercommit(alt)
	if !alt.Share {
		r := v.trial
		if err := p.state.Commit(req, r); err != nil {
			return nil, fmt.Errorf("request %s: %w", alt.ResultName, err)
		}
		return []PlacedResult{{Alt: alt, Positions: r.GPUs, Weakest: r.WeakestLink, Agg: r.AggregateLink, Req: req}}, nil
	}
	// Count shares, each on a different GPU: as one set, weakest link
	// first, then packed (allocate.ShareSet), where the set can be chosen
	// exactly; else one by one.
	if alt.Count > 1 {
		set, err := allocate.ShareSet(p.state, allocate.Request{Share: v.share, Eligible: v.eligible}, alt.Count, p.pol)
		if err != nil {
			return nil, fmt.Errorf("request %s: %s", alt.ResultName, reasonOf(err))
		}
		if set != nil {
			out := make([]PlacedResult, 0, len(set))
			for _, pos := range set {
				req := allocate.Request{Share: v.share, Eligible: slices.Clone(v.eligible)}
				if err := p.state.Commit(req, allocate.Result{Node: p.state.Name, GPUs: []int{pos}}); err != nil {
					return nil, fmt.Errorf("request %s: %w", alt.ResultName, err)
				}
				out = append(out, PlacedResult{Alt: alt, Positions: []int{pos}, Share: v.share, Consumed: v.consumed, Req: req})
			}
			return out, nil
		}
	}
	elig := slices.Clone(v.eligible)
	var out []PlacedResult
	for i := range alt.Count {
		req := allocate.Request{Share: v.share, Eligible: slices.Clone(elig)}
		r := v.trial
		if i > 0 {
			var err error
			if r, err = allocate.Allocate(p.state, req, p.pol); err != nil {
				return nil, fmt.Errorf("request %s: %s", alt.ResultName, reasonOf(err))
			}
		}
		if err := p.state.Commit(req, r); err != nil {
			return nil, fmt.Errorf("request %s: %w", alt.ResultName, err)
		}
		elig[r.GPUs[0]] = false
		out = append(out, PlacedResult{Alt: alt, Positions: r.GPUs, Share: v.share, Consumed: v.consumed, Req: req})
	}
	return out, nil
}

// reasonOf returns the human reason of an allocator error.
func reasonOf(err error) string {
	var u *allocate.UnsatisfiableError
	if errors.As(err, &u) {
		return u.Reason
	}
	return err.Error()
}

// Summarize renders a plan for events: "gpu-0,gpu-3 on node-a: every pair NV2".
func (pl *Plan) Summarize() string {
	var parts []string
	for ci, claim := range pl.Claims {
		for _, r := range claim {
			names := make([]string, len(r.Positions))
			for i, pos := range r.Positions {
				names[i] = pl.Node.Devices[pos].Name
			}
			for _, m := range r.MIG {
				names = append(names, m.Name+" ("+m.Profile+")")
			}
			s := strings.Join(names, ",")
			switch {
			case r.Share != nil:
				s += fmt.Sprintf(" (share of %s memory, %d%% cores)", resource.NewQuantity(r.Share.MemoryBytes, resource.BinarySI).String(), r.Share.Cores)
			case len(r.Positions) > 1:
				s += ": " + linkSummary(pl.Node.Topo, r.Positions, r.Weakest)
			}
			parts = append(parts, r.Alt.ResultName+"="+s)
		}
		parts = append(parts, pl.foreignParts(ci)...)
	}
	return strings.Join(parts, "; ") + " on " + pl.Node.Node
}

// linkSummary says "every pair NV2" when all pairs share the weakest link
// class and "weakest link NV1" otherwise.
func linkSummary(t *topology.Topology, pos []int, weakest topology.Link) string {
	for i := range pos {
		for j := i + 1; j < len(pos); j++ {
			if t.Link(pos[i], pos[j]) != weakest {
				return "weakest link " + weakest.String()
			}
		}
	}
	return "every pair " + weakest.String()
}
