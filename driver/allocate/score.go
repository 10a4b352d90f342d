package allocate

import (
	"fmt"
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// NodeScore is one node's standing for one request, as ChooseNode ranks
// nodes: for whole GPUs the link quality of the node's best set, then the
// whole GPUs left free; for a share whether it opens a fresh GPU, the
// whole GPUs left free and the chosen GPU's load. Node names break ties
// (Better). Scores of different nodes are independent of each other, so a
// caller deciding often over many nodes may keep a node's score for as
// long as the node's state, the request and the policy are unchanged,
// and rank only what changed.
type NodeScore struct {
	share     bool
	key       key
	freeAfter int
	fresh     bool
	loadAfter int64
	// mixDependent: the score was computed with Policy.Mix (see
	// DependsOnMix).
	mixDependent bool
	// demand: ranked with Policy.Demand; then ideal (whole GPUs: the
	// set's weakest link is the best an idle node of this kind gives a
	// set of its size) and strand (GPU the placement strands for the
	// demand mix, weighted milli GPU) come first.
	demand bool
	ideal  bool
	strand int64
}

// DependsOnDemand tells whether the score was computed with
// Policy.Demand (and may differ under another one, or once the node's
// Host changes).
func (a NodeScore) DependsOnDemand() bool { return a.demand }

// Stranded is, with Policy.Demand, how much more GPU the placement
// leaves unusable to the demand mix (milli GPU weighted by the mix's
// counts; negative when it makes GPU usable again).
func (a NodeScore) Stranded() int64 { return a.strand }

// DependsOnMix tells whether the score may differ under another
// Policy.Mix with everything else equal. It does not for whole GPUs on
// nodes of at most 16 free GPUs (the exact search establishes the best
// quality without the fragmentation tie-break) nor for shares placed on a
// GPU that already holds shares, or on a fresh GPU of a node whose GPUs
// all have the same memory (the mix only chooses which fresh GPU).
func (a NodeScore) DependsOnMix() bool { return a.mixDependent }

// WeakestLink is, for whole GPUs, the weakest link of the node's best set
// (the set the allocator would give may differ among equally good ones,
// never in quality).
func (a NodeScore) WeakestLink() topology.Link { return a.key.link() }

// AggregateLink is, for whole GPUs, the sum of the link classes of the
// best set's pairs (ties on WeakestLink are broken by it).
func (a NodeScore) AggregateLink() int { return int(a.key.agg()) }

// ScoreNode ranks one node for a request: ok is false when the request
// does not fit the node. ChooseNode picks the node whose score is Better
// than every other's (TestScoreNodeAgreesWithChooseNode). err is for
// invalid input only.
func ScoreNode(n *NodeState, req Request, pol Policy) (s NodeScore, ok bool, err error) {
	s, _, ok, err = scoreNode(n, req, pol)
	return s, ok, err
}

// scoreNode is ScoreNode, with the GPUs the placement whose stranding the
// score counts takes: the set (whole GPUs) or the GPU of the share.
func scoreNode(n *NodeState, req Request, pol Policy) (s NodeScore, set uint64, ok bool, err error) {
	if err := req.Validate(); err != nil {
		return NodeScore{}, 0, false, err
	}
	if err := pol.Validate(); err != nil {
		return NodeScore{}, 0, false, err
	}
	if err := n.Validate(); err != nil {
		return NodeScore{}, 0, false, err
	}
	if err := checkEligible(n, req); err != nil {
		return NodeScore{}, 0, false, fmt.Errorf("node %s: %w", nodeLabel(n.Name), err)
	}
	if n.Host != nil && !req.Host.fits(*n.Host) {
		return NodeScore{}, 0, false, nil
	}
	sc := getScratch()
	defer putScratch(sc)
	if req.Share != nil {
		pl, why := placeShare(sc, n, req, pol.GPU.spread(), pol.Mix, nil)
		if why != "" {
			return NodeScore{}, 0, false, nil
		}
		return shareNodeScore(n, req, pl, pol.Demand, nil), 1 << pl.pos, true, nil
	}
	free := freeMask(n)
	cand := free & eligibleMask(n, req)
	if bits.OnesCount64(cand) < req.GPUs {
		return NodeScore{}, 0, false, nil
	}
	p := pickWhole(sc, n.Topology, free, cand, req.GPUs, req.RequiredLink, false, pol.Mix)
	if !p.found {
		return NodeScore{}, 0, false, nil
	}
	s = wholeNodeScore(p.key, bits.OnesCount64(free)-req.GPUs, bits.OnesCount64(free) > exactMaxFree)
	return withDemand(s, n, req, cand, p.key, pol.Demand, nil), lowestFreeSet(cand, req.GPUs), true, nil
}

func wholeNodeScore(k key, freeAfter int, mixDependent bool) NodeScore {
	return NodeScore{key: k, freeAfter: freeAfter, mixDependent: mixDependent}
}

// withDemand adds the demand criteria to a whole-GPU score whose set has
// quality k, taken from cand; strands, when not nil, remembers the
// stranding across the nodes of one ranking.
func withDemand(s NodeScore, n *NodeState, req Request, cand uint64, k key, d *DemandMix, strands *strandCache) NodeScore {
	if d == nil {
		return s
	}
	s.demand = true
	s.ideal = k.weak() >= idealKey(n.Topology, req.GPUs).weak()
	s.strand = strands.delta(d, n, req, lowestFreeSet(cand, req.GPUs))
	return s
}

// shareNodeScore scores the share placed at pl on n; strands, when not
// nil, remembers the stranding across the nodes of one ranking.
func shareNodeScore(n *NodeState, req Request, pl sharePlacement, d *DemandMix, strands *strandCache) NodeScore {
	s := NodeScore{share: true, fresh: pl.fresh, freeAfter: pl.freeAfter, loadAfter: pl.loadAfter,
		mixDependent: pl.fresh && !uniformMemory(n)}
	if d != nil {
		s.demand = true
		s.strand = strands.delta(d, n, req, 1<<pl.pos)
	}
	return s
}

// uniformMemory tells whether every GPU of the node has the same memory.
func uniformMemory(n *NodeState) bool {
	gpus := n.Topology.GPUs
	for i := 1; i < len(gpus); i++ {
		if gpus[i].MemoryBytes != gpus[0].MemoryBytes {
			return false
		}
	}
	return true
}

// Better tells whether node a (tie key tieA: NodeState.TieKey, else its
// name) ranks before node b (tieB) for the same request under pol, as
// ChooseNode ranks them. Equal scores and tie keys rank neither first.
func (a NodeScore) Better(b NodeScore, tieA, tieB string, pol Policy) bool {
	if c := a.compare(b, pol.Node.spread()); c != 0 {
		return c > 0
	}
	return tieA < tieB
}

// compare orders two nodes' scores before names: positive when a ranks
// first. With Policy.Demand and binpack (nodes): whole GPUs on the node's
// ideal link class first, then the least GPU stranded; then as without.
// Whole GPUs: link quality, then the node-level strategy on the
// whole GPUs left free (binpack: fewer, keeping emptier nodes for large
// jobs; spread: more). Shares, binpack: a GPU that already holds shares
// (no whole GPU lost), then fewer whole GPUs left free, then the fuller
// GPU; spread: more whole GPUs left free, then the emptier GPU.
func (a NodeScore) compare(b NodeScore, spread bool) int {
	if a.demand && b.demand && !spread {
		if !a.share && a.ideal != b.ideal {
			return boolOrder(a.ideal)
		}
		if a.strand != b.strand {
			return boolOrder(a.strand < b.strand)
		}
	}
	if a.share && !spread && a.fresh != b.fresh {
		return boolOrder(!a.fresh)
	}
	if !a.share && a.key != b.key {
		return boolOrder(a.key > b.key)
	}
	if a.freeAfter != b.freeAfter {
		return boolOrder((a.freeAfter < b.freeAfter) != spread)
	}
	if a.share && a.loadAfter != b.loadAfter {
		return boolOrder((a.loadAfter > b.loadAfter) != spread)
	}
	return 0
}

func boolOrder(first bool) int {
	if first {
		return 1
	}
	return -1
}
