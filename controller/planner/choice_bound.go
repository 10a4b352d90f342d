package planner

import (
	"context"
	"slices"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// boundChoice decides a pod with several placements (several claims or
// requests, or a request for shares of several GPUs; no firstAvailable, no
// allocationMode All) by branch and bound, and returns the plan choosePlan
// would pick among the plans of every node admit lets through
// (quickChosen), or that there is none (quickNoFit); quickUnsure when the
// pod is not of that shape.
//
// Why it is exact: every plan of such a pod has RankSum 0 and as many
// placements, so choosePlan ranks them all by podScore, then node name
// (choosePod). For each node, podBound is a podScore no plan on the node
// can beat, computed from each request's best set on its own (kept in the
// scoreCache like a single-placement pod's scores) and the node's free
// GPUs; it is mix-independent and cheap. Nodes are taken in bound order
// (names ascending among equal bounds) and planned, after the node
// filter, until no remaining bound can beat the best plan found: a node
// whose bound is below the best cannot have a better plan, one whose bound
// equals it can only win by a smaller name.
//
// What makes it cheap: when the requests do not get in each other's way on
// the best nodes (the usual case), the first node planned reaches its
// bound and the search stops there. When they do on every node, it plans
// as many nodes as planning every node would.
func boundChoice(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, nodes []*NodeInventory, usage usageSource, cache *scoreCache, admit func(*NodeInventory) bool, pending []*Claim) (*Plan, quickVerdict) {
	var alts []*Alternative
	placements := 0
	for _, ic := range pending {
		for _, r := range ic.Requests {
			if len(r.Alternatives) != 1 {
				return nil, quickUnsure
			}
			alt := r.Alternatives[0]
			if alt.All || alt.Count < 1 {
				return nil, quickUnsure
			}
			alts = append(alts, alt)
			if alt.Share {
				placements += alt.Count
			} else {
				placements++
			}
		}
	}
	if placements < 2 {
		return nil, quickUnsure
	}
	for _, n := range nodes {
		if n.Topo.Len() > 16 {
			// Beyond 16 free GPUs the allocator's search is not exact,
			// so a request's best set on its own is no bound.
			return nil, quickUnsure
		}
	}
	sigs := make([]string, len(alts))
	shapes := make([]*shapeScores, len(alts))
	for i, alt := range alts {
		sigs[i], shapes[i] = shapeOf(cache, alt, pol, len(nodes), nil)
	}
	gens := make([]uint64, len(nodes))
	usage.Generations(nodes, gens)
	type bounded struct {
		node  *NodeInventory
		bound podScore
	}
	cands := make([]bounded, 0, len(nodes))
	for i, n := range nodes {
		if b, ok := podBound(ctx, sel, pol, n, usage, alts, sigs, shapes, gens[i]); ok {
			cands = append(cands, bounded{n, b})
		}
	}
	slices.SortFunc(cands, func(a, b bounded) int {
		if c := a.bound.compare(b.bound, pol); c != 0 {
			return -c
		}
		if a.node.Node < b.node.Node {
			return -1
		}
		return 1
	})
	var best *Plan
	var bestScore podScore
	for _, c := range cands {
		if best != nil {
			cmp := c.bound.compare(bestScore, pol)
			if cmp < 0 {
				break
			}
			if cmp == 0 && c.node.Node > best.Node.Node {
				// Only a smaller name could still win at this bound.
				continue
			}
		}
		if !admit(c.node) {
			continue
		}
		plan, _ := planNode(ctx, sel, pol, c.node, usage.NodeUsage(c.node), pending)
		if plan == nil {
			continue
		}
		s := scorePlan(plan)
		if best == nil {
			best, bestScore = plan, s
			continue
		}
		if cmp := s.compare(bestScore, pol); cmp > 0 || (cmp == 0 && plan.Node.Node < best.Node.Node) {
			best, bestScore = plan, s
		}
	}
	if best == nil {
		return nil, quickNoFit
	}
	return best, quickChosen
}

// podBound is a podScore no plan of the requests on the node can beat, or
// false when one of them cannot fit the node even on its own. A plan's
// multi-GPU sets are each at most as good as the request's best set on the
// node alone, so the worst of them, their size-weighted weakest links and,
// when those are equal (every set as good as the best), their aggregate
// links are bounded by the best sets'. A request for shares of c GPUs puts
// them on c distinct GPUs, of which at most the node's shared GPUs are not
// fresh, so shares open at least c minus those (packing GPUs, where fewer
// is better), and at most all shares or all GPUs left free (spreading);
// the whole GPUs left free are then exactly the free ones less the whole
// GPUs taken and the fresh GPUs opened. On an idle node the bound is what
// the plan gets unless the requests get in each other's way.
func podBound(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, n *NodeInventory, usage usageSource, alts []*Alternative, sigs []string, shapes []*shapeScores, gen uint64) (podScore, bool) {
	b := podScore{worst: topology.Link(255)}
	free, shared, whole, shares, widest := -1, 0, 0, 0, 0
	for i, alt := range alts {
		e := shapes[i].entry(ctx, sel, pol, n, usage, alt, sigs[i], gen, nil)
		if e.skip || (!e.nonUniform && !e.fits) {
			return podScore{}, false
		}
		free, shared = e.free, e.shared
		if alt.Share {
			shares += alt.Count
			widest = max(widest, alt.Count)
			continue
		}
		whole += alt.Count
		if alt.Count < 2 {
			continue
		}
		b.worst = min(b.worst, e.score.WeakestLink())
		b.weakSum += int(e.score.WeakestLink()) * alt.Count
		b.aggSum += e.score.AggregateLink()
	}
	if whole > free {
		return podScore{}, false
	}
	if pol.GPU == allocate.Spread {
		b.opened = min(shares, free-whole)
	} else {
		b.opened = max(0, widest-shared)
	}
	b.freeAfter = free - whole - b.opened
	return b, true
}
