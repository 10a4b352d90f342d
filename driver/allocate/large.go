package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// pickLarge searches nodes with more free GPUs than the exact table holds.
//
// Every pair of a set whose weakest link is at least c is linked at c or
// better, so the set lies inside one connected component of the graph of
// free GPUs joined by links >= c. Going down the link classes present, the
// first class c at which some component yields a set with weakest link
// >= c holds the optimum: searching every component with enough usable
// GPUs at that class finds it. Components of at most 16 free GPUs (an
// NVLink island, a PCIe switch, a NUMA node on most machines) are searched
// exactly; larger ones by beam search. Among components with equally good
// sets, the one with the fewest free GPUs wins (best fit, which keeps
// intact islands for large jobs), then lowest positions. Fragmentation
// criteria 3-4 of doc.go are applied within the winning component.
func pickLarge(sc *scratch, t *topology.Topology, free, cand uint64, k int, required topology.Link, tieBreak bool, mix *SizeMix) pick {
	p := searchComponents(sc, t, free, cand, k, required, tieBreak, mix)
	if p.found {
		p.bestAny, p.anyExists = p.key, true
		return p
	}
	// Search again without the requirement only to explain the failure.
	loose := searchComponents(sc, t, free, cand, k, topology.LinkNone, false, mix)
	p.bestAny, p.anyExists = loose.key, loose.found
	return p
}

func searchComponents(sc *scratch, t *topology.Topology, free, cand uint64, k int, required topology.Link, tieBreak bool, mix *SizeMix) pick {
	classes := linkClasses(t, free)
	for c := topology.NVLink(topology.MaxNVLinkLanes); c >= topology.LinkSYS && c >= required; c-- {
		if classes>>c&1 == 0 {
			continue
		}
		var best pick
		var bestFree int
		for rest := free; rest != 0; {
			comp := component(t, rest, bits.TrailingZeros64(rest), c)
			rest &^= comp
			if bits.OnesCount64(comp&cand) < k {
				continue
			}
			var p pick
			switch {
			case bits.OnesCount64(comp) > exactMaxFree:
				p = beamSearch(sc, t, comp, comp&cand, k, c)
			case tieBreak:
				p = exactPick(sc, t, comp, comp&cand, k, c, true, mix)
			default:
				p = boundSearch(t, comp&cand, k, c)
			}
			if !p.found {
				continue
			}
			n := bits.OnesCount64(comp)
			if !best.found || componentBeats(p, n, best, bestFree) {
				best, bestFree = p, n
			}
		}
		if best.found {
			return best
		}
	}
	return pick{}
}

// linkClasses is the set of link classes between free GPUs, as bits.
func linkClasses(t *topology.Topology, free uint64) uint32 {
	var classes uint32
	for a := free; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		for b := a & (a - 1); b != 0; b &= b - 1 {
			classes |= 1 << t.Link(i, bits.TrailingZeros64(b))
		}
	}
	return classes
}

// component is the set of GPUs in within reachable from start over links
// of class c or better.
func component(t *topology.Topology, within uint64, start int, c topology.Link) uint64 {
	comp := uint64(1) << start
	frontier := comp
	for frontier != 0 {
		g := bits.TrailingZeros64(frontier)
		frontier &^= 1 << g
		for m := within &^ comp; m != 0; m &= m - 1 {
			h := bits.TrailingZeros64(m)
			if t.Link(g, h) >= c {
				comp |= 1 << h
				frontier |= 1 << h
			}
		}
	}
	return comp
}

// componentBeats orders the sets found in different components: weakest
// link, then the component with fewer free GPUs (best fit: like criterion
// 3, keeping intact islands intact comes before the aggregate), then the
// aggregate, then lowest positions.
func componentBeats(p pick, n int, best pick, bestFree int) bool {
	if p.key.weak() != best.key.weak() {
		return p.key.weak() > best.key.weak()
	}
	if n != bestFree {
		return n < bestFree
	}
	if p.key != best.key {
		return p.key > best.key
	}
	return lowerPositions(p.set, best.set)
}
