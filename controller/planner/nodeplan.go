package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
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
			saved := slices.Clone(p.state.Usage)
			savedMax, savedOvercommit := p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent
			res, err := p.placeAlt(alt, v)
			if err == nil {
				if all, ok := p.placeFrom(ic, i+1, v.bound, append(slices.Clip(placed), res...)); ok {
					return all, true
				}
			} else {
				p.note("%s", err.Error())
			}
			p.state.Usage = saved
			p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent = savedMax, savedOvercommit
		}
	}
	return nil, false
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

// variant is one candidate set of devices for an alternative: a group of
// equal matchAttribute values and, for shares, equal consumption.
type variant struct {
	eligible []bool
	bound    []string
	share    *allocate.ShareRequest
	consumed map[resourceapi.QualifiedName]resource.Quantity
	label    string
	// trial is the allocator's answer for the first placement, computed
	// on the node state placeAlt will see.
	trial allocate.Result
}

// variants splits the eligible devices into groups the alternative may
// draw from, best first: constraints already bound restrict the devices,
// unbound ones split them by attribute value; shares split by what they
// would consume. Groups the allocator cannot satisfy are dropped.
func (p *placer) variants(ic *Claim, alt *Alternative, base []bool, bound []string) []variant {
	groups := map[string]*variant{}
	var order []string
	for pos, d := range p.node.Devices {
		if !base[pos] {
			continue
		}
		nb, key, ok := bindConstraints(ic.Constraints, alt.ResultName, bound, d.attr)
		if !ok {
			continue
		}
		var share *allocate.ShareRequest
		var consumed map[resourceapi.QualifiedName]resource.Quantity
		if alt.Share {
			sc := p.node.shareCons(alt, pos)
			if sc.err != nil {
				p.note("request %s: device %s on node %s: %v", alt.ResultName, d.Name, p.node.Node, sc.err)
				continue
			}
			share, consumed = sc.share, sc.consumed
			key += sc.key
		}
		g := groups[key]
		if g == nil {
			g = &variant{eligible: make([]bool, len(p.node.Devices)), bound: nb, share: share, consumed: consumed, label: key}
			groups[key] = g
			order = append(order, key)
		}
		g.eligible[pos] = true
	}
	if len(order) == 0 {
		if len(ic.Constraints) > 0 {
			p.note("request %s: no device on node %s satisfies the claim's matchAttribute constraints together with the devices already chosen", alt.ResultName, p.node.Node)
		}
		return nil
	}
	sort.Strings(order)
	var out []variant
	for _, k := range order {
		v := *groups[k]
		p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent = maxSharesPerGPU(alt), memoryOvercommit(alt)
		r, err := allocate.Allocate(p.state, p.firstRequest(alt, v), p.pol)
		if err != nil {
			p.note("request %s: %s", alt.ResultName, reasonOf(err))
			continue
		}
		v.trial = r
		out = append(out, v)
	}
	if !alt.Share {
		sort.SliceStable(out, func(i, j int) bool {
			a, b := out[i].trial, out[j].trial
			if a.WeakestLink != b.WeakestLink {
				return a.WeakestLink > b.WeakestLink
			}
			return a.AggregateLink > b.AggregateLink
		})
	}
	return out
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

// maxSharesPerGPU is the node state's share cap while placing the
// alternative: its config's maxSharesPerGPU for a share, else none.
func maxSharesPerGPU(alt *Alternative) int {
	if alt.Share && alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.MaxSharesPerGPU != nil {
		return *alt.Config.Sharing.MaxSharesPerGPU
	}
	return 0
}

// memoryOvercommit is the node state's memory over-commit while placing
// the alternative: its config's memoryOvercommitPercent for a share (the
// DeviceClass's opt-in, which a claim may only lower), else none.
func memoryOvercommit(alt *Alternative) int {
	if alt.Share && alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.MemoryOvercommitPercent != nil {
		return *alt.Config.Sharing.MemoryOvercommitPercent
	}
	return 0
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

// shareConsumption computes what a share of the alternative takes from a
// device: every capacity the device publishes (as kube-scheduler records
// it), and the memory/cores the allocator accounts.
func shareConsumption(d *DeviceInfo, alt *Alternative) (*allocate.ShareRequest, map[resourceapi.QualifiedName]resource.Quantity, error) {
	consumed := map[resourceapi.QualifiedName]resource.Quantity{}
	share := &allocate.ShareRequest{Group: alt.ShareGroup}
	haveMem := false
	for name, c := range d.CEL.Capacity {
		fq := qualify(string(name), d.CEL.Driver)
		var want *resource.Quantity
		if q, ok := alt.Capacity[fq]; ok {
			want = &q
		} else if fq == capMemory && alt.ConfigMemory != nil {
			want = alt.ConfigMemory
		} else if fq == capCores && alt.ConfigCores != nil {
			want = resource.NewQuantity(*alt.ConfigCores, resource.DecimalSI)
		}
		v, err := consumption(want, c)
		if err != nil {
			return nil, nil, fmt.Errorf("capacity %s: %w", name, err)
		}
		consumed[name] = *resource.NewQuantity(v, c.Value.Format)
		switch fq {
		case capMemory:
			share.MemoryBytes, haveMem = v, true
		case capCores:
			share.Cores = v
		}
	}
	for fq := range alt.Capacity {
		if _, ok := d.capacity(fq); !ok {
			return nil, nil, fmt.Errorf("the request asks for capacity %s, which the device does not publish", fq)
		}
	}
	if !haveMem {
		return nil, nil, errors.New("the device publishes no memory capacity, so it cannot be shared")
	}
	if _, ok := d.capacity(capCores); !ok {
		// Without a cores capacity the device is shared by memory only;
		// the allocator still needs a compute share to account.
		share.Cores = 1
		if alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.DefaultCores != nil {
			share.Cores = *alt.Config.Sharing.DefaultCores
		}
	}
	if share.MemoryBytes < 1 || share.Cores < 1 || share.Cores > 100 {
		return nil, nil, fmt.Errorf("share of %d bytes and %d%% cores is outside what one GPU can give", share.MemoryBytes, share.Cores)
	}
	return share, consumed, nil
}

// reasonOf returns the human reason of an allocator error.
func reasonOf(err error) string {
	var u *allocate.UnsatisfiableError
	if errors.As(err, &u) {
		return u.Reason
	}
	return err.Error()
}

// choosePlan picks among feasible plans: fewest firstAvailable fallbacks
// first. A pod with a single placement (one claim, one request, one
// device set) is then ranked by allocate.ChooseNode (link quality, then
// the node packing strategy), with ineligible devices masked as taken; a
// pod with several is ranked by all of them together (see podScore).
//
// rank, when not nil, gives the nodes' and the pod's CPU and memory to
// allocate.ChooseNode (stranding.go).
func choosePlan(plans []*Plan, pol allocate.Policy, rank *hostRanking) *Plan {
	if len(plans) == 0 {
		return nil
	}
	best := plans[0].RankSum
	for _, pl := range plans {
		best = min(best, pl.RankSum)
	}
	var tied []*Plan
	for _, pl := range plans {
		if pl.RankSum == best {
			tied = append(tied, pl)
		}
	}
	if len(tied) == 1 {
		return tied[0]
	}
	if tied[0].placements() > 1 {
		return choosePod(tied, pol)
	}
	first := tied[0].Claims[0][0]
	states := make([]*allocate.NodeState, 0, len(tied))
	var same []*Plan
	for _, pl := range tied {
		pr := pl.Claims[0][0]
		if pr.Alt.ResultName != first.Alt.ResultName {
			continue
		}
		usage := slices.Clone(pl.Base)
		for pos := range usage {
			if pr.Req.Eligible != nil && !pr.Req.Eligible[pos] {
				usage[pos] = allocate.GPUUsage{Exclusive: true}
			}
		}
		st := &allocate.NodeState{Name: pl.Node.Node, Topology: pl.Node.Topo, Usage: usage, MaxSharesPerGPU: maxSharesPerGPU(pr.Alt), MemoryOvercommitPercent: memoryOvercommit(pr.Alt),
			Host: rank.nodeHost(pl.Node.Node)}
		states = append(states, st)
		same = append(same, pl)
	}
	req := first.Req
	req.Eligible = nil
	req.Host = rank.request()
	if r, err := allocate.ChooseNode(states, req, pol); err == nil {
		for _, pl := range same {
			if pl.Node.Node == r.Node {
				return pl
			}
		}
	}
	// The allocator could not rank them (the first request differs per
	// node, e.g. All): best links of the first request, then name.
	sort.SliceStable(tied, func(i, j int) bool {
		a, b := tied[i].Claims[0][0], tied[j].Claims[0][0]
		if a.Weakest != b.Weakest {
			return a.Weakest > b.Weakest
		}
		if a.Agg != b.Agg {
			return a.Agg > b.Agg
		}
		return tied[i].Node.Node < tied[j].Node.Node
	})
	return tied[0]
}

// placements counts the device sets of a plan (one per whole-GPU result
// group, one per share).
func (pl *Plan) placements() int {
	n := 0
	for _, c := range pl.Claims {
		n += len(c)
	}
	return n
}

// podScore ranks a whole pod's plan on one node, by the criteria
// allocate.ChooseNode applies to one request, summed over every placement:
// the weakest link of the worst multi-GPU set, then the weakest links of
// all sets weighted by their size, then their aggregate links; then, for
// shares, how many fresh GPUs they open (binpack: fewer); then the whole
// GPUs the node has free afterwards (binpack: fewer, spread: more).
type podScore struct {
	worst     topology.Link
	weakSum   int
	aggSum    int
	opened    int
	freeAfter int
}

func scorePlan(pl *Plan) podScore {
	s := podScore{worst: topology.Link(255)}
	taken := map[int]bool{}
	for _, c := range pl.Claims {
		for _, r := range c {
			for _, pos := range r.Positions {
				if r.Share != nil && !taken[pos] && pl.Base[pos] == (allocate.GPUUsage{}) {
					s.opened++
				}
				taken[pos] = true
			}
			if r.Share != nil || len(r.Positions) < 2 {
				continue
			}
			s.worst = min(s.worst, r.Weakest)
			s.weakSum += int(r.Weakest) * len(r.Positions)
			s.aggSum += r.Agg
		}
	}
	for pos, u := range pl.Base {
		if u == (allocate.GPUUsage{}) && !taken[pos] {
			s.freeAfter++
		}
	}
	return s
}

// choosePod ranks plans of pods with several placements by podScore, then
// node name.
func choosePod(plans []*Plan, pol allocate.Policy) *Plan {
	scores := make(map[*Plan]podScore, len(plans))
	for _, pl := range plans {
		scores[pl] = scorePlan(pl)
	}
	best := plans[0]
	for _, pl := range plans[1:] {
		c := scores[pl].compare(scores[best], pol)
		if c > 0 || (c == 0 && pl.Node.Node < best.Node.Node) {
			best = pl
		}
	}
	return best
}

// compare orders two pods' scores before node names: positive when a
// ranks first.
func (a podScore) compare(b podScore, pol allocate.Policy) int {
	spreadNodes := pol.Node == allocate.Spread
	spreadGPUs := pol.GPU == allocate.Spread
	first := func(aFirst bool) int {
		if aFirst {
			return 1
		}
		return -1
	}
	switch {
	case a.worst != b.worst:
		return first(a.worst > b.worst)
	case a.weakSum != b.weakSum:
		return first(a.weakSum > b.weakSum)
	case a.aggSum != b.aggSum:
		return first(a.aggSum > b.aggSum)
	case a.opened != b.opened:
		return first((a.opened < b.opened) != spreadGPUs)
	case a.freeAfter != b.freeAfter:
		return first((a.freeAfter < b.freeAfter) != spreadNodes)
	}
	return 0
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

// shareCons is the memoised consumption of one share on one device.
type shareCons struct {
	share    *allocate.ShareRequest
	consumed map[resourceapi.QualifiedName]resource.Quantity
	key      string
	err      error
}

// shareCons returns what a share of the alternative takes from the device
// at pos, memoised per node inventory and share signature.
func (n *NodeInventory) shareCons(alt *Alternative, pos int) *shareCons {
	memoKey := "share:" + alt.shareSig
	n.memoMu.Lock()
	row, ok := n.shareMemo.get(memoKey)
	if !ok {
		row = make([]*shareCons, len(n.Devices))
		n.shareMemo.put(memoKey, row)
	}
	sc := row[pos]
	n.memoMu.Unlock()
	if sc != nil {
		return sc
	}
	sc = &shareCons{}
	sc.share, sc.consumed, sc.err = shareConsumption(n.Devices[pos], alt)
	if sc.err == nil {
		names := make([]string, 0, len(sc.consumed))
		for name := range sc.consumed {
			names = append(names, string(name))
		}
		sort.Strings(names)
		var b strings.Builder
		fmt.Fprintf(&b, "share=%d/%d;", sc.share.MemoryBytes, sc.share.Cores)
		for _, name := range names {
			q := sc.consumed[resourceapi.QualifiedName(name)]
			b.WriteString(name + "=" + q.String() + ";")
		}
		sc.key = b.String()
	}
	n.memoMu.Lock()
	row[pos] = sc
	n.memoMu.Unlock()
	return sc
}

// bindConstraints checks one device against the claim's matchAttribute
// constraints that apply to the request resultName, given the values
// bound so far (one per constraint, "" while unbound): ok when the device
// has every constrained attribute as a scalar equal to the bound value. It
// returns the values bound with the device and a key naming them, which
// groups the devices that agree.
func bindConstraints(constraints []matchConstraint, resultName string, bound []string, attr func(resourceapi.FullyQualifiedName) (resourceapi.DeviceAttribute, bool)) (nb []string, key string, ok bool) {
	nb = slices.Clone(bound)
	for ci, c := range constraints {
		if !c.appliesTo(resultName) {
			continue
		}
		a, has := attr(c.Attr)
		val, scalar := attrKey(a)
		if !has || !scalar || (nb[ci] != "" && nb[ci] != val) {
			return nil, "", false
		}
		nb[ci] = val
		key += string(c.Attr) + "=" + val + ";"
	}
	return nb, key, true
}
