package allocate

import (
	"fmt"
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// ChooseNode scores every node and returns the best node with its GPU set;
// see doc.go for the order. Nodes with equal names are tied by their order
// in nodes. It changes no node.
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

// wholeScore is one node's standing for a whole-GPU request.
type wholeScore struct {
	idx       int
	key       key
	freeAfter int
}

// beats orders nodes: link quality of the best set, then the node-level
// strategy on the whole GPUs left free, then name, then input order.
func (a wholeScore) beats(b wholeScore, nodes []*NodeState, spread bool) bool {
	if a.key != b.key {
		return a.key > b.key
	}
	return tailBeats(a.freeAfter, b.freeAfter, a.idx, b.idx, nodes, spread)
}

// tailBeats compares by the node-level strategy (binpack: fewer whole GPUs
// left free, keeping emptier nodes for large jobs; spread: more), then name.
func tailBeats(freeA, freeB, idxA, idxB int, nodes []*NodeState, spread bool) bool {
	if freeA != freeB {
		return (freeA < freeB) != spread
	}
	if na, nb := nodes[idxA].Name, nodes[idxB].Name; na != nb {
		return na < nb
	}
	return idxA < idxB
}

func chooseWhole(nodes []*NodeState, req Request, pol Policy) (Result, error) {
	k, spread := req.GPUs, pol.Node.spread()
	sc := getScratch()
	defer putScratch(sc)
	best := wholeScore{idx: -1}
	// What to say when nothing fits: the node with the most usable GPUs,
	// and the best set found on nodes that had enough but missed the link.
	mostIdx, mostFree := -1, -1
	looseIdx, looseKey := -1, key(0)
	for i, n := range nodes {
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
			ub := wholeScore{idx: i, key: upperBound(n.Topology, cand, k), freeAfter: freeAfter}
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
		if s := (wholeScore{idx: i, key: p.key, freeAfter: freeAfter}); best.idx < 0 || s.beats(best, nodes, spread) {
			best = s
		}
	}
	if best.idx < 0 {
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

// shareScore is one node's standing for a share.
type shareScore struct {
	idx int
	pl  sharePlacement
}

// beats orders nodes for a share. Binpack: a GPU that already holds shares
// (no whole GPU lost), then fewer whole GPUs left free, then the fuller
// GPU. Spread: more whole GPUs left free, then the emptier GPU. Then name.
func (a shareScore) beats(b shareScore, nodes []*NodeState, spread bool) bool {
	if !spread && a.pl.fresh != b.pl.fresh {
		return !a.pl.fresh
	}
	if a.pl.freeAfter != b.pl.freeAfter {
		return (a.pl.freeAfter < b.pl.freeAfter) != spread
	}
	if a.pl.loadAfter != b.pl.loadAfter {
		return (a.pl.loadAfter > b.pl.loadAfter) != spread
	}
	return tailBeats(0, 0, a.idx, b.idx, nodes, spread)
}

func chooseShare(nodes []*NodeState, req Request, pol Policy) (Result, error) {
	sc := getScratch()
	defer putScratch(sc)
	best := shareScore{idx: -1}
	for i, n := range nodes {
		pl, why := placeShare(sc, n, req, pol.GPU.spread(), pol.Mix)
		if why != "" {
			continue
		}
		if s := (shareScore{idx: i, pl: pl}); best.idx < 0 || s.beats(best, nodes, pol.Node.spread()) {
			best = s
		}
	}
	if best.idx < 0 {
		return Result{}, &UnsatisfiableError{Reason: fmt.Sprintf(
			"no node has a GPU that fits a share of %s memory and %d%% cores (%d nodes checked)",
			formatBytes(req.Share.MemoryBytes), req.Share.Cores, len(nodes))}
	}
	return Result{Node: nodes[best.idx].Name, GPUs: []int{best.pl.pos}}, nil
}
