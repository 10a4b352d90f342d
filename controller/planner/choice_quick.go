package planner

import (
	"container/heap"
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/gpulink/gpulink/driver/allocate"
)

// usageSource is what a decision reads of the devices' usage: the ledger,
// or a test's own.
type usageSource interface {
	// NodeUsage returns the usage of a node's devices in topology order.
	NodeUsage(n *NodeInventory) []allocate.GPUUsage
	// Generations sets out[i] to a number that changes whenever the usage
	// of nodes[i] changes, and returns the count of changes (below) they
	// include.
	Generations(nodes []*NodeInventory, out []uint64) uint64
	// Changes appends to out the pools whose generation moved after the
	// first since changes, in order, and returns the count of changes
	// now; ok is false when they are no longer all known.
	Changes(since uint64, out []string) (_ []string, now uint64, ok bool)
}

// quickVerdict is what quickChoice could establish.
type quickVerdict int

const (
	// quickUnsure: the pod is not of the shape, or the shortcut cannot
	// vouch for the answer; the caller filters and plans every node.
	quickUnsure quickVerdict = iota
	// quickChosen: the result holds the plan.
	quickChosen
	// quickNoFit: no node that admit lets through fits the pod.
	quickNoFit
)

// quickChoice decides a pod with a single placement (one claim, one
// request, no firstAvailable, no matchAttribute, whole GPUs by count or
// one share) without planning every node, and returns the plan choosePlan
// would have picked among the plans of every node admit lets through
// (quickChosen), or that there is none (quickNoFit).
//
// Why it is exact: for such a pod every feasible plan has RankSum 0, and
// choosePlan ranks them by allocate.ChooseNode over each node's usage with
// the plan's ineligible devices masked as taken. The plan's eligible
// devices are the ones that pass the selectors (memoised per node), the
// taints and, for shares, shareability and one share size; they can be
// computed without the allocator. ChooseNode's ranking is a total order of
// independent per-node scores (allocate.ScoreNode, allocate.NodeScore's
// Better), so the node it picks among the admitted ones is the best-scored
// node that admit lets through: the nodes are scored, then admitted best
// first until one passes, and only that one is planned, which gives the
// devices planning it among all the others gives.
//
// What makes it cheap on large clusters: a node's score depends only on
// the node (immutable inventory), its usage, the request's shape and the
// policy, so it is kept per shape in a scoreCache and recomputed only for
// nodes whose usage changed (usageSource.generations) since; and the pod
// fit filter (admit), which reads Node objects and the pods on each node,
// runs only on the nodes that rank above the winner. Whenever a node's
// devices would split into several share sizes, or nodes disagree on the
// share size (choosePlan then ranks by the first node's size), the
// verdict is quickUnsure.
func quickChoice(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, nodes []*NodeInventory, usage usageSource, cache *scoreCache, admit func(*NodeInventory) bool, pending []*Claim, rank *hostRanking) (*quickResult, quickVerdict) {
	if len(pending) != 1 {
		return nil, quickUnsure
	}
	ic := pending[0]
	if len(ic.Requests) != 1 || len(ic.Constraints) != 0 || len(ic.Requests[0].Alternatives) != 1 {
		return nil, quickUnsure
	}
	alt := ic.Requests[0].Alternatives[0]
	if alt.All || alt.Count < 1 || (alt.Share && alt.Count != 1) {
		return nil, quickUnsure
	}
	sig, scores := shapeOf(cache, alt, pol, len(nodes), rank)
	var ranked rankedNodes
	if ix := cache.indexFor(scores, nodes); ix != nil {
		ix.sync(ctx, scoreInput{sel: sel, pol: pol, usage: usage, alt: alt, sig: sig, rank: rank}, nodes, scores)
		if ix.unsure() {
			return nil, quickUnsure
		}
		ranked = ix.walk()
	} else {
		h, ok := rankAll(ctx, sel, pol, nodes, usage, scores, alt, sig, rank)
		if !ok {
			return nil, quickUnsure
		}
		ranked = h
	}
	for ranked.Len() > 0 {
		n := ranked.next()
		if !admit(n) {
			continue
		}
		plan, _ := planNode(ctx, sel, pol, n, usage.NodeUsage(n), pending)
		if plan == nil {
			return nil, quickUnsure
		}
		return &quickResult{plan: plan, rest: ranked}, quickChosen
	}
	return nil, quickNoFit
}

// rankAll ranks the nodes the shape fits by their kept or fresh scores;
// false when quickChoice cannot vouch for a choice (some node's devices
// take several share sizes, or nodes disagree on the share size).
func rankAll(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, nodes []*NodeInventory, usage usageSource, scores *shapeScores, alt *Alternative, sig string, rank *hostRanking) (*rankHeap, bool) {
	gens := make([]uint64, len(nodes))
	usage.Generations(nodes, gens)
	h := &rankHeap{pol: pol, items: make([]rankedNode, 0, len(nodes))}
	shareKey := ""
	for i, n := range nodes {
		e := scores.entry(ctx, sel, pol, n, usage, alt, sig, gens[i], rank)
		if e.skip {
			continue
		}
		if e.nonUniform {
			return nil, false
		}
		if alt.Share {
			if shareKey == "" {
				shareKey = e.shareKey
			} else if e.shareKey != shareKey {
				return nil, false
			}
		}
		if e.fits {
			h.items = append(h.items, rankedNode{node: n, score: e.score})
		}
	}
	heap.Init(h)
	return h, true
}

// rankedNodes gives the nodes a shape fits best first.
type rankedNodes interface {
	// Len is how many are left.
	Len() int
	next() *NodeInventory
}

// maxExplainedNodes bounds the nodes planned to say why a pod fits none
// after quickChoice found so.
const maxExplainedNodes = 64

// explainNoFit plans admitted nodes, in order, only for the reasons they
// do not fit, until five distinct reasons (the waiting message shows four
// and counts the rest) or maxExplainedNodes; ok is false if one fits after
// all (its usage changed since it was scored), and the caller then plans
// every node.
func explainNoFit(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, cands []*NodeInventory, usage usageSource, pending []*Claim) (why []string, ok bool) {
	for i, n := range cands {
		if i == maxExplainedNodes || len(dedupe(why)) > 4 {
			break
		}
		plan, reasons := planNode(ctx, sel, pol, n, usage.NodeUsage(n), pending)
		if plan != nil {
			return nil, false
		}
		why = append(why, reasons...)
	}
	return why, true
}

// quickResult is a quick choice and the nodes ranked below it.
type quickResult struct {
	plan *Plan
	rest rankedNodes
}

// maxSampledAlternatives bounds the nodes planned after a quick choice to
// name alternatives in the allocation event.
const maxSampledAlternatives = 8

// alternatives plans the next-best nodes admit lets through, in rank
// order, until three fit or maxSampledAlternatives were tried, for the
// allocation event's note. It returns the chosen plan first, the reasons
// the others did not fit and how many nodes that fit were not planned.
func (q *quickResult) alternatives(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, usage usageSource, admit func(*NodeInventory) bool, pending []*Claim) (plans []*Plan, why []string, unexamined int) {
	plans = []*Plan{q.plan}
	for tried := 0; tried < maxSampledAlternatives && len(plans) < 4 && q.rest.Len() > 0; {
		n := q.rest.next()
		if !admit(n) {
			continue
		}
		tried++
		if plan, reasons := planNode(ctx, sel, pol, n, usage.NodeUsage(n), pending); plan != nil {
			plans = append(plans, plan)
		} else {
			why = append(why, reasons...)
		}
	}
	return plans, why, q.rest.Len()
}

// rankedNode is a node that fits, with its score.
type rankedNode struct {
	node  *NodeInventory
	score allocate.NodeScore
}

// rankHeap pops the best-ranked node first (allocate.NodeScore.Better,
// names breaking ties, as ChooseNode ranks).
type rankHeap struct {
	pol   allocate.Policy
	items []rankedNode
}

func (h *rankHeap) Len() int { return len(h.items) }
func (h *rankHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	return a.score.Better(b.score, a.node.tie(), b.node.tie(), h.pol)
}
func (h *rankHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *rankHeap) Push(x any)    { h.items = append(h.items, x.(rankedNode)) }
func (h *rankHeap) Pop() any {
	last := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return last
}
func (h *rankHeap) next() *NodeInventory { return heap.Pop(h).(rankedNode).node }

// scoreNode computes a node's entry for one request shape: whether the
// shape may fit at all, its devices' share size and, when it fits, its
// score with the ineligible devices masked as taken (as choosePlan ranks).
func scoreNode(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, n *NodeInventory, usage usageSource, alt *Alternative, sig string, gen uint64, rank *hostRanking, host *allocate.Host) *scoreEntry {
	// A score is computed with or without a demand mix, and ranks only
	// against scores computed with the same one. Set before the early
	// returns: an entry that cannot fit is kept for the same mix too (it
	// was computed afresh on every decision with stranding on, a fifth of
	// the nodes for a 4-GPU pod on a 70 %-busy cluster).
	e := &scoreEntry{node: n, gen: gen, demand: pol.Demand}
	u := sanitizeUsage(usage.NodeUsage(n))
	for _, g := range u {
		switch {
		case g == (allocate.GPUUsage{}):
			e.free++
		case !g.Exclusive && g.Shares > 0:
			e.shared++
		}
	}
	if !mayFit(u, alt) {
		// Planning it fails too, whatever its devices.
		e.skip = true
		return e
	}
	q := quickEligible(ctx, sel, n, alt, sig)
	switch {
	case !q.uniform:
		e.nonUniform = true
		return e
	case !q.any:
		e.skip = true
		return e
	}
	for pos := range u {
		if !q.elig[pos] {
			u[pos] = allocate.GPUUsage{Exclusive: true}
		}
	}
	req := allocate.Request{GPUs: alt.Count, RequiredLink: alt.RequiredLink}
	if alt.Share {
		req = allocate.Request{Share: q.share}
		e.shareKey = q.shareKey
	}
	req.Host = rank.request()
	st := &allocate.NodeState{Name: n.Node, TieKey: n.tie(), Topology: n.Topo, Usage: u,
		MaxSharesPerGPU: maxSharesPerGPU(alt), MemoryOvercommitPercent: memoryOvercommit(alt), Host: host}
	s, basis, ok, err := allocate.ScoreNodeWithBasis(st, req, pol)
	if err != nil {
		// Cannot happen for sanitized usage; let planning every node
		// explain it.
		e.nonUniform = true
		return e
	}
	e.fits, e.score, e.basis = ok, s, basis
	if ok && s.DependsOnMix() {
		// Valid only for this size mix, the default one (nil) included.
		e.mixDependent, e.mix = true, pol.Mix
	}
	return e
}

// shapeOf returns the alternative's signature and the scores kept for it
// (as one request on its own) under pol.
func shapeOf(cache *scoreCache, alt *Alternative, pol allocate.Policy, nodes int, rank *hostRanking) (string, *shapeScores) {
	sig := quickSignature(alt)
	return sig, cache.shape(fmt.Sprintf("%s\x03%d/%d/%d/%d/%s/%s%s", sig, alt.Count, alt.RequiredLink,
		maxSharesPerGPU(alt), memoryOvercommit(alt), pol.Node, pol.GPU, rank.key()), nodes)
}

// entry returns the node's kept entry for the shape, computing it when
// none is valid for the node's usage generation.
//
// With rank, the entry is also only valid for the demand mix it was
// computed with, and for the node's CPU and memory left: the usage source
// counts a change of those in the node's generation (ledger.touch), so
// that a decision reads them only for the nodes it scores again.
func (s *shapeScores) entry(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, n *NodeInventory, usage usageSource, alt *Alternative, sig string, gen uint64, rank *hostRanking) *scoreEntry {
	if e := s.get(n, gen, pol.Mix); e != nil && e.demand == pol.Demand {
		return e
	}
	e := scoreNode(ctx, sel, pol, n, usage, alt, sig, gen, rank, rank.nodeHost(n.Node))
	s.put(n, e)
	nodesScored.Add(1)
	return e
}

// nodesScored counts the node scores computed afresh (not taken from the
// cache): the work a decision's choice costs, which the 5,000-node
// benchmarks report beside the time (a count a loaded machine does not
// blur).
var nodesScored atomic.Int64

// scoreEntry is one node's standing for one request shape, valid while
// the node's inventory and usage generation are the ones it was computed
// for (and, for a score that depends on it, the size mix).
type scoreEntry struct {
	node *NodeInventory
	gen  uint64
	// mixDependent: the score is only valid for the size mix mix.
	mixDependent bool
	mix          *allocate.SizeMix
	// demand is the demand mix the score was computed with (nil: none);
	// basis ranks it under another one (rankIndex.restrand).
	demand *allocate.DemandMix
	basis  *allocate.StrandBasis
	// skip: the shape cannot fit (too few GPUs free, no eligible device);
	// nonUniform: the node's devices take several share sizes.
	skip, nonUniform bool
	shareKey         string
	fits             bool
	score            allocate.NodeScore
	// free counts the node's GPUs nothing uses (whatever the request may
	// use), as scorePlan counts them; shared those that hold shares only.
	free, shared int
}

// mayFit is a cheap necessary condition for the alternative to fit on a
// node with this (sanitized) usage: k GPUs free to be given out whole, or
// one GPU not given out whole for a share. Eligibility only removes GPUs.
func mayFit(usage []allocate.GPUUsage, alt *Alternative) bool {
	free, open := 0, 0
	for _, u := range usage {
		if !u.Exclusive {
			open++
			if u.Shares == 0 {
				free++
			}
		}
	}
	if alt.Share {
		return open > 0
	}
	return free >= alt.Count
}

// quickElig is what quickChoice needs of one node for one alternative:
// the devices it may use (read-only) and, for a share, the one share size
// they all take. Memoised per node, since a node's inventory is immutable
// and selectors, taints and share sizes depend on nothing else.
type quickElig struct {
	elig []bool
	// any: some device qualifies; uniform: they all take one share size.
	any, uniform bool
	shareKey     string
	share        *allocate.ShareRequest
}

// quickSignature identifies what quickElig depends on in an alternative.
func quickSignature(alt *Alternative) string {
	var b strings.Builder
	for _, s := range alt.Selectors {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, t := range alt.Tolerations {
		fmt.Fprintf(&b, "\x01%s/%s/%s/%s", t.Key, t.Operator, t.Value, t.Effect)
		if t.TolerationSeconds != nil {
			fmt.Fprintf(&b, "/%d", *t.TolerationSeconds)
		}
	}
	if alt.Share {
		b.WriteString("\x02share:" + alt.shareSig)
	}
	return b.String()
}

// quickEligible is baseEligible without the reasons, narrowed for a share
// as placer.variants does, memoised per node and signature.
func quickEligible(ctx context.Context, sel *SelectorEvaluator, n *NodeInventory, alt *Alternative, sig string) *quickElig {
	n.memoMu.Lock()
	if n.quickMemo == nil {
		n.quickMemo = newLRU[*quickElig](memoEntriesPerNode)
	}
	q, ok := n.quickMemo.get(sig)
	n.memoMu.Unlock()
	if ok {
		return q
	}
	elig, _, err := sel.eligibleBySelectors(ctx, n, alt.Selectors)
	if err != nil {
		// Not memoised: it may be the context's.
		return &quickElig{uniform: true}
	}
	q = &quickElig{elig: elig, uniform: true}
	for pos, d := range n.Devices {
		if !elig[pos] {
			continue
		}
		if _, bad := UntoleratedTaint(d, alt.Tolerations); bad || (alt.Share && !d.AllowMultiple) {
			elig[pos] = false
			continue
		}
		if alt.Share {
			sc := n.shareCons(alt, pos)
			if sc.err != nil {
				elig[pos] = false
				continue
			}
			if !q.any {
				q.shareKey, q.share = sc.key, sc.share
			} else if sc.key != q.shareKey {
				q.uniform = false
			}
		}
		q.any = true
	}
	n.memoMu.Lock()
	n.quickMemo.put(sig, q)
	n.memoMu.Unlock()
	return q
}

// exhaustivePlans plans every candidate node; used when quickChoice does
// not apply and by tests as the reference.
func exhaustivePlans(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, cands []*NodeInventory, usageOf func(*NodeInventory) []allocate.GPUUsage, pending []*Claim) (plans []*Plan, failed int, why []string) {
	for _, n := range cands {
		plan, reasons := planNode(ctx, sel, pol, n, usageOf(n), pending)
		if plan != nil {
			plans = append(plans, plan)
		} else {
			failed++
			why = append(why, reasons...)
		}
	}
	return plans, failed, why
}
