package planner

import (
	"slices"
	"sort"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// Choosing among the feasible plans of one pod on different nodes.

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
		st := &allocate.NodeState{Name: pl.Node.Node, TieKey: pl.Node.tie(), Topology: pl.Node.Topo, Usage: usage, MaxSharesPerGPU: maxSharesPerGPU(pr.Alt), MemoryOvercommitPercent: memoryOvercommit(pr.Alt),
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
		return tied[i].Node.tie() < tied[j].Node.tie()
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
		if c > 0 || (c == 0 && pl.Node.tie() < best.Node.tie()) {
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
