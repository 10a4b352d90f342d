package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// boundSearch finds the best quality of a k-subset of cand (criteria 1-2
// only) by depth-first branch and bound, for scoring nodes where the
// fragmentation tie-break is not needed. GPUs are tried lowest position
// first and only a strictly better set replaces the incumbent, so the set
// returned is the lowest-position one of the best quality. A branch is cut
// when even every missing pair at the best link among cand could not beat
// the incumbent; adding GPUs never raises the weakest link, so on nodes
// with link hierarchies most branches die after two or three GPUs, and
// the search ends as soon as a set reaches that bound (at once on uniform
// NVLink nodes).
func boundSearch(t *topology.Topology, cand uint64, k int, required topology.Link) pick {
	b := bnb{t: t, k: k, required: uint8(required), pairs: uint32(k * (k - 1) / 2)}
	for m := cand; m != 0; m &= m - 1 {
		b.order[b.n] = uint8(bits.TrailingZeros64(m))
		b.n++
	}
	if b.n < k {
		return pick{}
	}
	if k == 1 {
		return pick{set: uint64(1) << b.order[0], key: singleKey, found: true}
	}
	b.ceiling = upperBound(t, cand, k)
	b.topLink = b.ceiling.weak()
	b.dfs(0, 0, 0, noPairs, 0)
	return pick{set: b.bestSet, key: b.best, found: b.best != 0}
}

type bnb struct {
	t        *topology.Topology
	k        int
	required uint8
	pairs    uint32
	n        int
	order    [topology.MaxGPUs]uint8
	topLink  uint8
	ceiling  key
	best     key
	bestSet  uint64
	done     bool
}

// dfs extends set (size GPUs, quality w/agg) with GPUs from order[from:].
func (b *bnb) dfs(from int, set uint64, size int, w uint8, agg uint32) {
	if size == b.k {
		if kk := makeKey(w, agg); kk > b.best {
			b.best, b.bestSet = kk, set
			b.done = kk == b.ceiling
		}
		return
	}
	have := uint32(size * (size - 1) / 2)
	for i := from; i <= b.n-(b.k-size) && !b.done; i++ {
		g := int(b.order[i])
		nw, nagg := w, agg
		for a := set; a != 0; a &= a - 1 {
			l := uint8(b.t.Link(bits.TrailingZeros64(a), g))
			nw = min(nw, l)
			nagg += uint32(l)
		}
		if size >= 1 && nw < b.required {
			continue
		}
		// Pairs still to come can be at most the best link present and
		// the weakest link can only fall.
		added := uint32(size)
		ub := makeKey(min(nw, b.topLink), nagg+(b.pairs-have-added)*uint32(b.topLink))
		if b.best != 0 && ub <= b.best {
			continue
		}
		b.dfs(i+1, set|1<<g, size+1, nw, nagg)
	}
}

// scorePick is exactPick without the tie-break, by branch and bound.
func scorePick(t *topology.Topology, cand uint64, k int, required topology.Link) pick {
	p := boundSearch(t, cand, k, required)
	if p.found {
		p.bestAny, p.anyExists = p.key, true
		return p
	}
	loose := boundSearch(t, cand, k, topology.LinkNone)
	p.bestAny, p.anyExists = loose.key, loose.found
	return p
}
