package planner

import (
	"container/heap"
	"context"

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
	// Over the inventory's list, each request's scores come from its
	// shape's index (only the nodes changed since rescored), by position;
	// otherwise from the scores kept per node.
	indexes := make([]*rankIndex, len(alts))
	for i, alt := range alts {
		if indexes[i] = cache.indexFor(shapes[i], nodes); indexes[i] == nil {
			indexes = nil
			break
		}
		indexes[i].sync(ctx, scoreInput{sel: sel, pol: pol, usage: usage, alt: alt, sig: sigs[i]}, nodes, shapes[i])
	}
	var gens []uint64
	if indexes == nil {
		gens = make([]uint64, len(nodes))
		usage.Generations(nodes, gens)
	}
	cands := &boundHeap{pol: pol, items: make([]boundedNode, 0, len(nodes))}
	entries := make([]*scoreEntry, len(alts))
	for i, n := range nodes {
		for a, alt := range alts {
			if indexes != nil {
				entries[a] = indexes[a].entries[i]
			} else {
				entries[a] = shapes[a].entry(ctx, sel, pol, n, usage, alt, sigs[a], gens[i], nil)
			}
		}
		if b, ok := podBound(pol, alts, entries); ok {
			cands.items = append(cands.items, boundedNode{n, b})
		}
	}
	// Taken best first; usually the first node planned reaches its bound,
	// so a heap, not a sort of every node.
	heap.Init(cands)
	var best *Plan
	var bestScore podScore
	for cands.Len() > 0 {
		c := heap.Pop(cands).(boundedNode)
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
		if cmp := s.compare(bestScore, pol); cmp > 0 || (cmp == 0 && plan.Node.tie() < best.Node.tie()) {
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
func podBound(pol allocate.Policy, alts []*Alternative, entries []*scoreEntry) (podScore, bool) {
	b := podScore{worst: topology.Link(255)}
	free, shared, whole, shares, widest := -1, 0, 0, 0, 0
	for i, alt := range alts {
		e := entries[i]
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

// boundedNode is a node with the bound of its plans.
type boundedNode struct {
	node  *NodeInventory
	bound podScore
}

// boundHeap pops the node of the best bound first, names ascending among
// equal bounds.
type boundHeap struct {
	pol   allocate.Policy
	items []boundedNode
}

func (h *boundHeap) Len() int { return len(h.items) }
func (h *boundHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if c := a.bound.compare(b.bound, h.pol); c != 0 {
		return c > 0
	}
	return a.node.tie() < b.node.tie()
}
func (h *boundHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *boundHeap) Push(x any)    { h.items = append(h.items, x.(boundedNode)) }
func (h *boundHeap) Pop() any {
	last := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return last
}
