package planner

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// ForeignResult is the other drivers' devices chosen for one request.
type ForeignResult struct {
	Req     *ForeignRequest
	Devices []*ForeignDevice
}

// foreignNode is what planning a node sees of other drivers' devices:
// the node's devices by name, whether a claim holds one, and what the
// plan took already (for a pod's earlier claims).
type foreignNode struct {
	view  *ForeignNode
	held  func(DeviceKey) bool
	taken map[DeviceKey]bool
	// chosen is the last claim's choice, until planNode takes it.
	chosen []ForeignResult
	// cands memoises each request's candidates until taken changes: every
	// GPU set tried for a claim sees the same ones. A claim asks for few
	// such requests: a list, where a map per node planned was about a
	// tenth of a GPU+NIC decision's allocations.
	cands []foreignCands
}

// foreignCands are a request's candidates on a node.
type foreignCands struct {
	req     *ForeignRequest
	devices []*ForeignDevice
}

// maxForeignAttempts bounds the search over other drivers' devices for
// one placement of a claim's GPUs.
const maxForeignAttempts = 4096

// takeForeign returns the foreign devices chosen for the claim just
// placed (nil when it asks for none).
func (p *placer) takeForeign() []ForeignResult {
	if p.foreign == nil {
		return nil
	}
	out := p.foreign.chosen
	p.foreign.chosen = nil
	return out
}

// placeForeign chooses the claim's other drivers' devices given the
// constraint values its GPUs bound: for each request in order, the
// lowest-named free devices that match its selectors, tolerate their
// taints and satisfy the claim's matchAttribute constraints, backtracking
// over devices as kube-scheduler's allocator does. False (after noting
// why) sends placeFrom to the next GPU set, in the allocator's order of
// preference.
func (p *placer) placeForeign(ic *Claim, bound []string, placed []PlacedResult) bool {
	if len(ic.Foreign) == 0 {
		return true
	}
	f := p.foreign
	if f == nil {
		p.note("claim %s/%s asks for other drivers' devices, which are not planned together with MIG devices", ic.Claim.Namespace, ic.Claim.Name)
		return false
	}
	cands := make([][]*ForeignDevice, len(ic.Foreign))
	for j, fr := range ic.Foreign {
		cands[j] = p.foreignCandidates(fr)
		if len(cands[j]) < fr.Count {
			p.noteForeignShort(fr, len(cands[j]))
			return false
		}
	}
	s := &foreignSearch{ic: ic, cands: cands, taken: map[DeviceKey]bool{}, chosen: make([][]*ForeignDevice, len(ic.Foreign))}
	if !s.request(0, bound) {
		if s.attempts >= maxForeignAttempts {
			p.note("gave up after %d attempts to choose other drivers' devices on node %s", maxForeignAttempts, p.node.Node)
		} else {
			p.note("%s", foreignShortfall(p.node.Node, ic, s.failed, bound, placed, p.node))
		}
		return false
	}
	out := make([]ForeignResult, len(ic.Foreign))
	for j, fr := range ic.Foreign {
		out[j] = ForeignResult{Req: fr, Devices: s.chosen[j]}
		for _, d := range s.chosen[j] {
			f.taken[d.Key()] = true
		}
	}
	f.cands = nil
	f.chosen = out
	return true
}

// foreignEnough tells whether the node has, for each of the claim's
// requests for other drivers' devices, as many candidates as it asks
// for (after noting why not). The candidates do not depend on the GPUs a
// placement of the claim takes (the constraints are checked in the
// search), so a node short of them fails for every GPU set: checked once
// before the GPU sets are tried, it costs no allocation per set
// (BenchmarkAlignedPodNearWaiting, a pod of a NIC rail taken everywhere).
func (p *placer) foreignEnough(ic *Claim) bool {
	if len(ic.Foreign) == 0 || p.foreign == nil {
		return true
	}
	for _, fr := range ic.Foreign {
		if n := len(p.foreignCandidates(fr)); n < fr.Count {
			p.noteForeignShort(fr, n)
			return false
		}
	}
	return true
}

// foreignShortOn is foreignEnough for each claim on its own, nothing
// taken yet (a necessary condition for the claims together): why the
// node falls short, nil when it does not.
//
// It memoises in a foreignNode of its own: the planning that follows
// lists the candidates again, with the notes (untolerated taints) that
// explain a later failure.
func foreignShortOn(ctx context.Context, sel *SelectorEvaluator, n *NodeInventory, claims []*Claim, fn *foreignNode) []string {
	p := &placer{ctx: ctx, sel: sel, node: n, foreign: &foreignNode{view: fn.view, held: fn.held, taken: fn.taken}}
	for _, ic := range claims {
		if !p.foreignEnough(ic) {
			return p.why
		}
	}
	return nil
}

func (p *placer) noteForeignShort(fr *ForeignRequest, have int) {
	p.note("request %s: node %s has %d free devices of DeviceClass %s that match its selectors and whose taints it tolerates, not %d",
		fr.ResultName, p.node.Node, have, fr.Class.Name, fr.Count)
}

// foreignCandidates are the node's devices a request may take, by name.
func (p *placer) foreignCandidates(fr *ForeignRequest) []*ForeignDevice {
	f := p.foreign
	for _, c := range f.cands {
		if c.req == fr {
			return c.devices
		}
	}
	var out []*ForeignDevice
	if f.view == nil {
		f.cands = append(f.cands, foreignCands{req: fr})
		return nil
	}
	for i, d := range f.view.Devices {
		if f.taken[d.Key()] || f.held(d.Key()) || !p.foreignMatches(fr, i) {
			continue
		}
		if t, bad := untoleratedForeignTaint(d, fr); bad {
			p.note("request %s: device %s of driver %s on node %s has taint %s=%s:%s, which the request does not tolerate", fr.ResultName, d.Name, d.Driver, p.node.Node, t.Key, t.Value, t.Effect)
			continue
		}
		out = append(out, d)
	}
	f.cands = append(f.cands, foreignCands{req: fr, devices: out})
	return out
}

// foreignMatches evaluates the request's selectors on the node's device i
// (k8s.io/dynamic-resource-allocation/cel, as for gpulink's devices). A
// runtime error (a missing attribute) is no match, and noted.
func (p *placer) foreignMatches(fr *ForeignRequest, i int) bool {
	for _, expr := range fr.Selectors {
		row, err := p.foreign.view.matching(p.ctx, p.sel, expr)
		if err != nil {
			p.note("request %s: %v", fr.ResultName, err)
			return false
		}
		if !row[i] {
			return false
		}
	}
	return true
}

// matching tells, per device of the node, whether the CEL expression
// matches it, memoised per expression. A runtime error on a device (a
// missing attribute) is no match; the error is the expression's
// compilation error.
func (v *ForeignNode) matching(ctx context.Context, sel *SelectorEvaluator, expr string) ([]bool, error) {
	v.memoMu.Lock()
	row, ok := v.memo.get(expr)
	v.memoMu.Unlock()
	if ok {
		return row, nil
	}
	prog, err := sel.compile(expr)
	if err != nil {
		return nil, err
	}
	row = make([]bool, len(v.Devices))
	for k, dev := range v.Devices {
		m, _, err := prog.DeviceMatches(ctx, dev.CEL)
		if err != nil {
			klog.FromContext(ctx).V(5).Info("CEL selector failed on another driver's device", "selector", expr, "driver", dev.Driver, "pool", dev.Pool, "device", dev.Name, "err", err)
		}
		row[k] = m && err == nil
	}
	v.memoMu.Lock()
	v.memo.put(expr, row)
	v.memoMu.Unlock()
	return row, nil
}

// foreignSearch is the backtracking choice of a claim's other drivers'
// devices.
type foreignSearch struct {
	ic       *Claim
	cands    [][]*ForeignDevice
	taken    map[DeviceKey]bool
	chosen   [][]*ForeignDevice
	attempts int
	// failed is the first request no choice satisfied.
	failed int
}

func (s *foreignSearch) request(j int, bound []string) bool {
	if j == len(s.ic.Foreign) {
		return true
	}
	if s.pick(j, 0, bound, nil) {
		return true
	}
	s.failed = max(s.failed, j)
	return false
}

// pick chooses request j's devices from position start on, lowest name
// first, each bound to the constraints with the devices chosen before.
func (s *foreignSearch) pick(j, start int, bound []string, picked []*ForeignDevice) bool {
	fr := s.ic.Foreign[j]
	if len(picked) == fr.Count {
		s.chosen[j] = slices.Clone(picked)
		return s.request(j+1, bound)
	}
	for i := start; i < len(s.cands[j]); i++ {
		if len(s.cands[j])-i < fr.Count-len(picked) || s.attempts >= maxForeignAttempts {
			return false
		}
		d := s.cands[j][i]
		if s.taken[d.Key()] {
			continue
		}
		nb, _, ok := bindConstraints(s.ic.Constraints, fr.ResultName, bound, d.attr)
		if !ok {
			continue
		}
		s.attempts++
		s.taken[d.Key()] = true
		if s.pick(j, i+1, nb, append(picked, d)) {
			return true
		}
		delete(s.taken, d.Key())
	}
	return false
}

// foreignShortfall explains a failed choice: "request nic: no 2 free
// devices of DeviceClass nic.example.com under
// resource.kubernetes.io/pcieRoot=pci0000:00 of gpu-0,gpu-1 on node a".
func foreignShortfall(node string, ic *Claim, j int, bound []string, placed []PlacedResult, n *NodeInventory) string {
	fr := ic.Foreign[j]
	var under []string
	for ci, c := range ic.Constraints {
		if !c.appliesTo(fr.ResultName) || bound[ci] == "" {
			continue
		}
		var gpus []string
		for _, r := range placed {
			if c.appliesTo(r.Alt.ResultName) {
				for _, pos := range r.Positions {
					gpus = append(gpus, n.Devices[pos].Name)
				}
			}
		}
		s := fmt.Sprintf("%s=%s", c.Attr, boundValue(bound[ci]))
		if len(gpus) > 0 {
			s += " of " + strings.Join(gpus, ",")
		}
		under = append(under, s)
	}
	msg := fmt.Sprintf("request %s: no %d free devices of DeviceClass %s", fr.ResultName, fr.Count, fr.Class.Name)
	if len(under) > 0 {
		msg += " under " + strings.Join(under, " and ")
	} else if len(ic.Constraints) > 0 {
		msg += " that satisfy the claim's matchAttribute constraints"
	}
	return msg + " on node " + node
}

// boundValue renders an attrKey for messages, without its type prefix.
func boundValue(key string) string {
	if _, v, ok := strings.Cut(key, ":"); ok {
		return v
	}
	return key
}

// untoleratedForeignTaint returns a NoSchedule or NoExecute taint of the
// device that the request does not tolerate, as kube-scheduler checks it.
func untoleratedForeignTaint(d *ForeignDevice, fr *ForeignRequest) (resourceapi.DeviceTaint, bool) {
	for _, t := range d.Taints {
		if t.Effect != resourceapi.DeviceTaintEffectNoSchedule && t.Effect != resourceapi.DeviceTaintEffectNoExecute {
			continue
		}
		if !tolerates(fr.Tolerations, t) {
			return t, true
		}
	}
	return resourceapi.DeviceTaint{}, false
}

// foreignParts renders claim ci's other drivers' devices for events:
// "nic=nic-0,nic-1 (nic.example.com)".
func (pl *Plan) foreignParts(ci int) []string {
	if ci >= len(pl.Foreign) {
		return nil
	}
	var parts []string
	for _, r := range pl.Foreign[ci] {
		names := make([]string, len(r.Devices))
		drivers := map[string]bool{}
		var ds []string
		for i, d := range r.Devices {
			names[i] = d.Name
			if !drivers[d.Driver] {
				drivers[d.Driver] = true
				ds = append(ds, d.Driver)
			}
		}
		parts = append(parts, r.Req.ResultName+"="+strings.Join(names, ",")+" ("+strings.Join(ds, ",")+")")
	}
	return parts
}

// ForeignResults returns claim i's other drivers' devices in the plan.
func (pl *Plan) ForeignResults(i int) []ForeignResult {
	if i >= len(pl.Foreign) {
		return nil
	}
	return pl.Foreign[i]
}

// ForeignKeys are the other drivers' devices the plan gives its first
// claims claims (the pod's pending ones).
func (pl *Plan) ForeignKeys(claims int) []DeviceKey {
	var out []DeviceKey
	for i := range claims {
		for _, fr := range pl.ForeignResults(i) {
			for _, d := range fr.Devices {
				out = append(out, d.Key())
			}
		}
	}
	return out
}

// chooseForeign plans pods whose claims ask for other drivers' devices on
// every candidate node, with the node's devices of other drivers, and
// ranks the plans as any other (choosePlan). The shortcuts score nodes by
// their GPUs alone, so they do not apply; the nodes are planned in
// parallel (parallel.go).
func (p *Planner) chooseForeign(ctx context.Context, pol allocate.Policy, cands []*NodeInventory, pending []*Claim, heldOff HeldOff, rank *hostRanking) (chosen *Plan, plans []*Plan, why []string, failed int) {
	// A waiting pod's nodes without room keep that answer, and why, until
	// their usage, their other drivers' devices or the holds on them
	// change (foreign_waiting.go); with devices held off, under what they
	// are.
	key, classes := claimsKey(pending)
	key = heldOff.keptUnder(key)
	kept := p.waiting.of(key)
	gens := make([]uint64, len(cands))
	p.ledger.Generations(cands, gens)
	// Every node's outcome, and the state of those planned now (for the
	// misses kept): an array per decision, so the per-node entry is kept
	// small.
	outcomes := make([]foreignOutcome, len(cands))
	var toPlan []int
	var stamps []nodeStamp
	for i, n := range cands {
		view := p.inv.Foreign(n.Node)
		at := nodeStamp{gen: gens[i], pol: pol, foreign: view, foreignGen: p.ledger.ForeignGeneration(view)}
		var hit bool
		if outcomes[i].why, hit = kept.missed(n, at); !hit {
			toPlan, stamps = append(toPlan, i), append(stamps, at)
		}
	}
	planEach(p.parallelism, len(toPlan), func(j int) {
		i := toPlan[j]
		n, o := cands[i], &outcomes[i]
		fn := &foreignNode{view: stamps[j].foreign, held: p.heldOn(heldOff, n.Node), taken: map[DeviceKey]bool{}}
		// A node short of any claim's other devices, each claim counted
		// alone, fails before its GPU usage is even read.
		if o.why = foreignShortOn(ctx, p.sel, n, pending, fn); o.why == nil {
			o.plan, o.why = planNodeWith(ctx, p.sel, pol, n, p.ledger.NodeUsage(n), pending, fn)
		}
	})
	var misses []nodeMiss
	for j, i := range toPlan {
		if o := &outcomes[i]; o.plan == nil {
			misses = append(misses, nodeMiss{node: cands[i], missEntry: missEntry{nodeStamp: stamps[j], why: o.why}})
		}
	}
	for i, n := range cands {
		o := &outcomes[i]
		if o.plan != nil {
			plans = append(plans, o.plan)
			continue
		}
		failed++
		// A pool left out (incomplete, say) may be why its devices are
		// missing: say so rather than only that they are.
		for _, msg := range p.inv.foreignProblemsOn(n.Node) {
			why = append(why, "other drivers' devices not used: "+msg)
		}
		why = append(why, o.why...)
	}
	if len(plans) == 0 {
		p.waiting.keep(key, classes, misses, p.inv)
	}
	return choosePlan(plans, pol, rank), plans, why, failed
}

// foreignOutcome is one candidate node's answer in chooseForeign: its
// plan or why it has none, kept from an earlier decision or planned now.
type foreignOutcome struct {
	plan *Plan
	why  []string
}
