package allocate

import (
	"math/bits"
	"slices"
)

// futureLevels are the bits, indexed by set size, of the sizes whose best
// remaining set the tie-break protects: powers of two from 2 up to what
// can remain after taking k of f free GPUs.
func futureLevels(f, k int) uint32 {
	var lv uint32
	for j := 2; j <= f-k; j *= 2 {
		lv |= 1 << j
	}
	return lv
}

// tieBreaker holds what criteria 3-5 need about the free GPUs.
type tieBreaker struct {
	q      *table
	levels uint32
	full   uint32
	top    *[exactMaxFree + 1]key
	row    [exactMaxFree]uint32 // sum of each GPU's links to the other free GPUs
	all    uint32               // aggregate of all free GPUs
}

// restAgg is agg(R) for R = free \ s, from agg(free) = agg(s) + agg(R) +
// links between s and R, where those links are the row sums of s minus
// twice agg(s). It needs only q[s], which the pass computed.
func (tb *tieBreaker) restAgg(s uint32) uint32 {
	var rows uint32
	for m := s; m != 0; m &= m - 1 {
		rows += tb.row[bits.TrailingZeros32(m)&(exactMaxFree-1)]
	}
	return tb.all + tb.q[s&0xFFFF].agg() - rows
}

type tied struct {
	set  uint32
	rest uint32 // agg(R)
}

// before orders candidates by criteria 4-5.
func (a tied) before(b tied) bool {
	if a.rest != b.rest {
		return a.rest > b.rest
	}
	return lowerPositions(uint64(a.set), uint64(b.set))
}

// choose picks among equally good sets: first by the best set left for
// each future size (larger sizes first), then by the aggregate of
// everything left, then by lowest positions.
func (tb *tieBreaker) choose(sc *scratch, ties []uint32) uint32 {
	if len(ties) == 1 {
		return ties[0]
	}
	cands := sc.tied[:0]
	for _, s := range ties {
		cands = append(cands, tied{set: s, rest: tb.restAgg(s)})
	}
	sc.tied = cands
	first := cands[0]
	for _, c := range cands[1:] {
		if c.before(first) {
			first = c
		}
	}
	if tb.levels == 0 {
		return first.set
	}
	// Nothing can leave more than the best of all free GPUs per level, so
	// a candidate that does, and wins the later criteria, wins outright;
	// on symmetric nodes (all NVLink) this ends the search at once.
	var v [exactMaxFree + 1]key
	future(tb.q, tb.full^first.set, tb.levels, &v)
	if v == *tb.top {
		return first.set
	}
	slices.SortFunc(cands, func(a, b tied) int {
		switch {
		case a.set == b.set:
			return 0
		case a.before(b):
			return -1
		}
		return 1
	})
	best, bestV := cands[0].set, v
	for _, c := range cands[1:] {
		if bestV == *tb.top {
			break
		}
		future(tb.q, tb.full^c.set, tb.levels, &v)
		if greaterFuture(&v, &bestV) {
			best, bestV = c.set, v
		}
	}
	return best
}

// future records in v, per set size in levels, the best quality among the
// subsets of rest.
func future(q *table, rest, levels uint32, v *[exactMaxFree + 1]key) {
	*v = [exactMaxFree + 1]key{}
	for sub := rest; sub != 0; sub = (sub - 1) & rest {
		pc := bits.OnesCount32(sub)
		if kk := q[sub&0xFFFF]; levels>>pc&1 != 0 && kk > v[pc] {
			v[pc] = kk
		}
	}
}

// greaterFuture compares future vectors with larger set sizes first.
func greaterFuture(a, b *[exactMaxFree + 1]key) bool {
	for j := exactMaxFree; j >= 2; j-- {
		if a[j] != b[j] {
			return a[j] > b[j]
		}
	}
	return false
}
