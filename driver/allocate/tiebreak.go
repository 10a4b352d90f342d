package allocate

import (
	"math/bits"
	"slices"
)

// tieBreaker holds what criteria 2-5 need about the free GPUs.
type tieBreaker struct {
	q      *table
	levels uint32 // future sizes with a weight in the mix, as bits
	mix    *SizeMix
	full   uint32
	top    *[exactMaxFree + 1]key // best quality per future size among all free GPUs
	row    [exactMaxFree]uint32   // sum of each GPU's links to the other free GPUs
	all    uint32                 // aggregate of all free GPUs
	loc    *local
	// within, when set, holds the best quality per size within every
	// subset (kindTable.within): future() becomes a lookup.
	within [][exactMaxFree + 1]key
	// long, when set, is the node's table for criterion 3d (the long
	// run), with all the node's GPUs in position numbering.
	long    *longRunTable
	longAll uint64
}

// capacity is how many size-j requests the rest could still serve at link
// class c, at least one when one can (has): the GPUs joined by links >= c
// form components, and a component of n GPUs holds n/j such sets when the
// class is a hierarchy level (a PCIe switch, a NUMA node, an NVLink
// island), where every pair inside is linked at c or better. Counting
// them, and not only whether one is left, keeps two pairs for two pair
// requests rather than one triple when pairs are asked for more often.
func capacity(l *local, rest uint32, j int, c uint8, has bool) uint64 {
	if !has {
		return 0
	}
	var n uint64
	for left := rest; left != 0; {
		comp := uint32(1) << bits.TrailingZeros32(left)
		frontier := comp
		for frontier != 0 {
			g := bits.TrailingZeros32(frontier)
			frontier &^= 1 << g
			for m := left &^ comp; m != 0; m &= m - 1 {
				h := bits.TrailingZeros32(m)
				if l.link[(g<<4|h)&0xFF] >= c {
					comp |= 1 << h
					frontier |= 1 << h
				}
			}
		}
		left &^= comp
		n += uint64(bits.OnesCount32(comp) / j)
	}
	return max(n, 1)
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

// tied is a candidate equal to the best on criterion 1.
type tied struct {
	set  uint32
	agg  uint32 // agg(S), criterion 2
	rest uint32 // agg(R), criterion 4
}

// before orders candidates by criteria 2, 4 and 5: the order in which
// criterion 3 visits them, so that the first to reach the best future
// possible wins without looking at the others.
func (a tied) before(b tied) bool {
	if a.agg != b.agg {
		return a.agg > b.agg
	}
	if a.rest != b.rest {
		return a.rest > b.rest
	}
	return lowerPositions(uint64(a.set), uint64(b.set))
}

// futureScore is criterion 3 for one candidate. kept is the mix weight of
// the future sizes whose best remaining set still has the weakest link the
// free GPUs offer that size before the take: the share of next requests
// that lose nothing to this one. exact is the same with the whole quality
// (weakest link and aggregate) kept.
type futureScore struct {
	kept, exact uint64
	v           [exactMaxFree + 1]key // best remaining quality per future size
	long        uint64                // criterion 3d, 0 when not weighed
}

func (tb *tieBreaker) score(rest uint32, s *futureScore) {
	if tb.within != nil {
		// The scan's result: per level the best quality of any subset.
		s.v = [exactMaxFree + 1]key{}
		w := &tb.within[rest]
		for lv := tb.levels; lv != 0; lv &= lv - 1 {
			j := bits.TrailingZeros32(lv)
			s.v[j] = w[j]
		}
	} else {
		future(tb.q, rest, tb.levels, tb.top, &s.v)
	}
	m := tb.mix.orDefault()
	s.kept, s.exact = 0, 0
	for lv := tb.levels; lv != 0; lv &= lv - 1 {
		j := bits.TrailingZeros32(lv)
		s.kept += uint64(m.w[j]) * capacity(tb.loc, rest, j, tb.top[j].weak(), s.v[j].weak() == tb.top[j].weak())
		if s.v[j] == tb.top[j] {
			s.exact += uint64(m.w[j])
		}
	}
	s.long = 0
	if tb.long != nil {
		s.long = tb.long.value(tb.longAll&^tb.loc.toPositions(tb.full^rest), tb.mix)
	}
}

// choose picks among sets equal on criterion 1 by criteria 3a (classes
// kept for the future, weighted by the mix), 2 (aggregate of the set), 3b
// (qualities kept), 3c (the best remaining sets, larger sizes first), 3d
// (ideal sets kept in the long run, when weighed), 4 (aggregate of the
// rest) and 5 (lowest positions).
func (tb *tieBreaker) choose(sc *scratch, ties []uint32) uint32 {
	if len(ties) == 1 {
		return ties[0]
	}
	cands := sc.tied[:0]
	for _, s := range ties {
		cands = append(cands, tied{set: s, agg: tb.q[s&0xFFFF].agg(), rest: tb.restAgg(s)})
	}
	sc.tied = cands
	return tb.chooseFrom(sc, cands, false)
}

// chooseFrom is choose over candidates with their criterion-2 and -4
// values; sorted says they are already in visiting order (a kind's
// precomputed ties, which must not be reordered: they are shared).
func (tb *tieBreaker) chooseFrom(sc *scratch, cands []tied, sorted bool) uint32 {
	if len(cands) == 1 {
		return cands[0].set
	}
	if tb.levels == 0 && tb.long == nil {
		if sorted {
			return cands[0].set
		}
		return slices.MinFunc(cands, cmpTied).set
	}
	// The first candidate in visiting order wins outright when it keeps
	// the most capacity possible and every future size's best quality;
	// on symmetric nodes (all NVLink) it does, and sorting thousands of
	// equal candidates would cost more than the rest of the search.
	best := cands[0]
	if !sorted {
		best = slices.MinFunc(cands, cmpTied)
	}
	bound := maxKept(tb, bits.OnesCount32(best.set))
	bs, cs := &sc.fut[0], &sc.fut[1]
	tb.score(tb.full^best.set, bs)
	// With the long run weighed (3d, after 3c), a later candidate that
	// keeps every quality too may still win on it.
	if bs.kept >= bound && bs.v == *tb.top && tb.long == nil {
		return best.set
	}
	if !sorted {
		slices.SortFunc(cands, cmpTied)
	}
	for _, c := range cands[1:] {
		// Candidates come in criterion-2 order: once the incumbent keeps
		// every class, only an equal aggregate could still beat it, and
		// once it keeps everything exactly, nothing after it can.
		if bs.kept >= bound && (c.agg < best.agg || (bs.v == *tb.top && tb.long == nil)) {
			break
		}
		tb.score(tb.full^c.set, cs)
		if cs.beats(bs, c, best) {
			best = c
			bs, cs = cs, bs
		}
	}
	return best.set
}

func cmpTied(a, b tied) int {
	switch {
	case a.set == b.set:
		return 0
	case a.before(b):
		return -1
	}
	return 1
}

// beats compares candidate a (score s) with the incumbent b (score o),
// which precedes a in the order of before.
func (s *futureScore) beats(o *futureScore, a, b tied) bool {
	if s.kept != o.kept {
		return s.kept > o.kept
	}
	if a.agg != b.agg {
		return a.agg > b.agg
	}
	if s.exact != o.exact {
		return s.exact > o.exact
	}
	if s.v != o.v {
		return greaterFuture(&s.v, &o.v)
	}
	if s.long != o.long {
		return s.long > o.long
	}
	return a.before(b)
}

// future records in v, per set size in levels, the best quality among the
// subsets of rest. No subset of rest beats the best of all free GPUs
// (top), so the scan stops once every level has reached it.
func future(q *table, rest, levels uint32, top *[exactMaxFree + 1]key, v *[exactMaxFree + 1]key) {
	*v = [exactMaxFree + 1]key{}
	open := levels
	for sub := rest; sub != 0 && open != 0; sub = (sub - 1) & rest {
		pc := bits.OnesCount32(sub)
		if kk := q[sub&0xFFFF]; open>>pc&1 != 0 && kk > v[pc] {
			v[pc] = kk
			if kk == top[pc] {
				open &^= 1 << pc
			}
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

// maxKept bounds criterion 3a for any take of k GPUs: a rest of f-k GPUs
// holds at most (f-k)/j sets of size j, and its components at a class
// are parts of those of all free GPUs, so it holds no more than they do.
func maxKept(tb *tieBreaker, k int) uint64 {
	m := tb.mix.orDefault()
	rest := uint64(bits.OnesCount32(tb.full) - k)
	var total uint64
	for lv := tb.levels; lv != 0; lv &= lv - 1 {
		j := bits.TrailingZeros32(lv)
		c := capacity(tb.loc, tb.full, j, tb.top[j].weak(), true)
		total += uint64(m.w[j]) * max(1, min(c, rest/uint64(j)))
	}
	return total
}
