package allocate

import (
	"fmt"
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// ChooseNode scores every node and returns the best node with its GPU set;
// see doc.go for the order. Nodes with equal tie keys (NodeState.TieKey,
// else names) are tied by their order in nodes. It changes no node.
func ChooseNode(nodes []*NodeState, req Request, pol Policy) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	if err := pol.Validate(); err != nil {
		return Result{}, err
	}
	if len(nodes) == 0 {
		return Result{}, &UnsatisfiableError{Reason: "no nodes to choose from"}
	}
	for i, n := range nodes {
		if err := n.Validate(); err != nil {
			return Result{}, fmt.Errorf("nodes[%d]: %w", i, err)
		}
		if err := checkEligible(n, req); err != nil {
			return Result{}, fmt.Errorf("nodes[%d]: %w", i, err)
		}
	}
	if req.Share != nil {
		return chooseShare(nodes, req, pol)
	}
	return chooseWhole(nodes, req, pol)
}

// ranked is one node's score during ChooseNode's scan.
type ranked struct {
	idx   int
	score NodeScore
}

// beats orders nodes by score, then tie key, then input order.
func (a ranked) beats(b ranked, nodes []*NodeState, spread bool) bool {
	if c := a.score.compare(b.score, spread); c != 0 {
		return c > 0
	}
	if ta, tb := nodes[a.idx].tie(), nodes[b.idx].tie(); ta != tb {
		return ta < tb
	}
	return a.idx < b.idx
}

func chooseWhole(nodes []*NodeState, req Request, pol Policy) (Result, error) {
	k, spread := req.GPUs, pol.Node.spread()
	sc := getScratch()
	defer putScratch(sc)
	best := ranked{idx: -1}
	// What to say when nothing fits: the node with the most usable GPUs,
	// and the best set found on nodes that had enough but missed the link.
	mostIdx, mostFree := -1, -1
	looseIdx, looseKey := -1, key(0)
	strands := &sc.strands
	strands.begin()
	for i, n := range nodes {
		if n.Host != nil && !req.Host.fits(*n.Host) {
			continue
		}
		free := freeMask(n)
		cand := free & eligibleMask(n, req)
		nc := bits.OnesCount64(cand)
		if nc < k {
			if nc > mostFree {
				mostIdx, mostFree = i, nc
			}
			continue
		}
		freeAfter := bits.OnesCount64(free) - k
		if best.idx >= 0 {
			// Skip the search on nodes that cannot win even with the best
			// link among their candidates on every pair.
			ub := ranked{idx: i, score: wholeNodeScore(upperBound(n.Topology, cand, k), freeAfter, false)}
			if pol.Demand != nil {
				// Stranding does not depend on which free GPUs are
				// taken; the set may at best be ideal.
				ub.score.demand, ub.score.ideal = true, true
				ub.score.strand = strands.delta(pol.Demand, n, req, lowestFreeSet(cand, k))
			}
			if !ub.beats(best, nodes, spread) {
				continue
			}
		}
		p := pickWhole(sc, n.Topology, free, cand, k, req.RequiredLink, false, pol.Mix)
		if !p.found {
			if p.anyExists && (looseIdx < 0 || p.bestAny > looseKey) {
				looseIdx, looseKey = i, p.bestAny
			}
			continue
		}
		score := withDemand(wholeNodeScore(p.key, freeAfter, false), n, req, cand, p.key, pol.Demand, strands)
		if s := (ranked{idx: i, score: score}); best.idx < 0 || s.beats(best, nodes, spread) {
			best = s
		}
	}
	if best.idx < 0 {
		if mostIdx < 0 && looseIdx < 0 {
			return Result{}, &UnsatisfiableError{Reason: hostShortReason(req, len(nodes))}
		}
		return Result{}, &UnsatisfiableError{Reason: noNodeReason(nodes, req, mostIdx, mostFree, looseIdx, looseKey)}
	}
	// Only the winner needs the fragmentation tie-break.
	return allocateWhole(nodes[best.idx], req, pol.Mix)
}

// upperBound is a quality no k-set of cand can exceed: every pair at the
// best link among cand's pairs.
func upperBound(t *topology.Topology, cand uint64, k int) key {
	if k < 2 {
		return singleKey
	}
	var top uint8
	for a := cand; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		for b := a & (a - 1); b != 0; b &= b - 1 {
			top = max(top, uint8(t.Link(i, bits.TrailingZeros64(b))))
		}
	}
	return makeKey(top, uint32(k*(k-1)/2)*uint32(top))
}

func noNodeReason(nodes []*NodeState, req Request, mostIdx, mostFree, looseIdx int, looseKey key) string {
	if looseIdx >= 0 {
		return fmt.Sprintf("no node has %d free GPUs with %s (best: %s, weakest link %s)",
			req.GPUs, linkPhrase(req.RequiredLink), nodeLabel(nodes[looseIdx].Name), looseKey.link())
	}
	what := "free"
	if req.restricted() {
		what = "eligible free"
	}
	return fmt.Sprintf("no node has %d %s GPUs (most: %s with %d of %d)",
		req.GPUs, what, nodeLabel(nodes[mostIdx].Name), mostFree, nodes[mostIdx].Topology.Len())
}

// hostShortReason is the reason when no node has the request's CPU and
// memory left.
func hostShortReason(req Request, nodes int) string {
	return fmt.Sprintf("no node has %dm CPU and %s memory left (%d nodes checked)",
		req.Host.CPUMilli, formatBytes(req.Host.MemoryBytes), nodes)
}

func chooseShare(nodes []*NodeState, req Request, pol Policy) (Result, error) {
	sc := getScratch()
	defer putScratch(sc)
	best := ranked{idx: -1}
	var bestPos int
	picks := freshPicks{}
	strands := &sc.strands
	strands.begin()
	for i, n := range nodes {
		if n.Host != nil && !req.Host.fits(*n.Host) {
			continue
		}
		pl, why := placeShare(sc, n, req, pol.GPU.spread(), pol.Mix, picks)
		if why != "" {
			continue
		}
		if s := (ranked{idx: i, score: shareNodeScore(n, req, pl, pol.Demand, strands)}); best.idx < 0 || s.beats(best, nodes, pol.Node.spread()) {
			best, bestPos = s, pl.pos
		}
	}
	if best.idx < 0 {
		return Result{}, &UnsatisfiableError{Reason: fmt.Sprintf(
			"no node has a GPU that fits a share of %s memory and %d%% cores (%d nodes checked)",
			formatBytes(req.Share.MemoryBytes), req.Share.Cores, len(nodes))}
	}
	return Result{Node: nodes[best.idx].Name, GPUs: []int{bestPos}}, nil
}
