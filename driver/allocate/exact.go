package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// exactMaxFree is the most free GPUs the exact search handles: it tabulates
// the quality of every subset of the free GPUs, 2^16 entries of 4 bytes.
const exactMaxFree = 16

// local renumbers the free GPUs 0..f-1 in position order, so subsets of the
// free GPUs are dense uint32 masks that index a table. Position order is
// kept, so lowest-position tie-breaks carry over unchanged.
type local struct {
	f   int
	pos [exactMaxFree]uint8
	// link is indexed by a<<4|b for local GPUs a and b.
	link [exactMaxFree * exactMaxFree]uint8
}

func (l *local) load(t *topology.Topology, free uint64) {
	l.f = 0
	for m := free; m != 0; m &= m - 1 {
		l.pos[l.f] = uint8(bits.TrailingZeros64(m))
		l.f++
	}
	for i := range l.f {
		for j := range l.f {
			l.link[i<<4|j] = uint8(t.Link(int(l.pos[i]), int(l.pos[j])))
		}
	}
}

func (l *local) toLocal(set uint64) uint32 {
	var m uint32
	for i := range l.f {
		if set>>l.pos[i]&1 != 0 {
			m |= 1 << i
		}
	}
	return m
}

func (l *local) toPositions(m uint32) uint64 {
	var set uint64
	for ; m != 0; m &= m - 1 {
		set |= 1 << l.pos[bits.TrailingZeros32(m)]
	}
	return set
}

// pairsKey is the quality of m, a set of two GPUs or more (local
// numbering) whose lowest GPU is a, with r = m\{a}, from the qualities
// of r, of m\{b} (b its second lowest GPU) and of m\{a,b}, which the pass
// in mask order has put in q before m: the pairs of m are those of m\{a},
// of m\{b} and {a,b}, so the weakest link is the least of three and the
// aggregate follows by inclusion-exclusion. The exact search's pass and a
// node kind's tables (buildKind) both fill their tables with it, which is
// what makes a kind's values the search's. It works on the packed keys
// (the least key holds the weakest link in its high bits; aggregates add
// in the low 16 bits, which never carry, see key) to stay within the
// compiler's inlining budget: the pass runs it for every subset.
func (l *local) pairsKey(q *table, m, r uint32) key {
	lb := r & -r // {b}
	qa, qb := q[uint16(r)], q[uint16(m^lb)]
	ab := key(l.link[uint8(bits.TrailingZeros32(m)<<4|bits.TrailingZeros32(r))])
	return min(qa, qb, ab<<16)&^0xFFFF | (qa+qb-q[uint16(r^lb)]+ab)&0xFFFF
}

// exactPick finds the best set of k GPUs in cand (a subset of free) with
// every subset of the free GPUs evaluated; see doc.go for the objective.
// Without tieBreak it only establishes the best quality (ChooseNode's node
// score) and returns the lowest-position set of that quality.
func exactPick(sc *scratch, t *topology.Topology, free, cand uint64, k int, required topology.Link, tieBreak bool, mix *SizeMix) pick {
	if !tieBreak {
		return scorePick(t, cand, k, required)
	}
	l := &sc.loc
	l.load(t, free)
	f := l.f
	if sc.q == nil {
		sc.q = new(table)
	}
	q := sc.q
	lcand := l.toLocal(cand)
	var mk memoKey
	if f >= memoMinFree {
		mk = makeMemoKey(l, lcand, k, required, mix)
		if v, ok := memo.get(&mk); ok {
			p := pick{found: v.found, key: v.key, bestAny: v.bestAny, anyExists: v.bestAny != 0}
			if v.found {
				p.set = l.toPositions(v.set)
			}
			return p
		}
	}
	if n := t.Len(); f >= memoMinFree && n <= exactMaxFree {
		// The node's kind's tables, when Prepare made them, hold what
		// the pass below would compute (in position numbering, which
		// orders sets as the local one does).
		kl := l
		if f != n {
			kl = &sc.kindLoc
			kl.load(t, fullMask(n))
		}
		if kt := kinds.get(kl, false); kt != nil {
			p := kindPick(sc, kt, uint32(free), uint32(cand), k, required, mix)
			v := memoVal{key: p.key, bestAny: p.bestAny, found: p.found}
			if p.found {
				v.set = l.toLocal(p.set)
			}
			memo.put(&mk, v)
			return p
		}
	}
	levels := mix.levels(f, k)
	// Subsets larger than both the request and the largest future level
	// are never looked at, so the pass skips them; on 16 free GPUs and
	// requests up to 8 that is 40% of the table.
	maxSize := max(k, bits.Len32(levels)-1)
	var top [exactMaxFree + 1]key // best quality per size, for the levels
	var best, bestAny key
	ties := sc.ties[:0]
	full := uint32(1)<<f - 1

	q[0] = singleKey
	for m := uint32(1); m <= full; m++ {
		pc := bits.OnesCount32(m)
		if pc > maxSize {
			continue
		}
		kk := singleKey
		if r := m & (m - 1); r != 0 { // r: m without its lowest GPU
			kk = l.pairsKey(q, m, r)
		}
		q[m&0xFFFF] = kk
		if pc == k && m&^lcand == 0 {
			bestAny = max(bestAny, kk)
			// Sets tie on criterion 1 (the weakest link) alone: the
			// aggregate (criterion 2) is weighed after the future.
			if kk.qualifies(k, required) {
				switch {
				case kk.weak() > best.weak() || best == 0:
					best = kk
					ties = append(ties[:0], m)
				case kk.weak() == best.weak():
					ties = append(ties, m)
				}
			}
		}
		if levels>>pc&1 != 0 && kk > top[pc] {
			top[pc] = kk
		}
	}
	sc.ties = ties
	p := pick{bestAny: bestAny, anyExists: bestAny != 0}
	if len(ties) == 0 {
		if f >= memoMinFree {
			memo.put(&mk, memoVal{bestAny: bestAny})
		}
		return p
	}
	p.found = true
	tb := tieBreaker{q: q, levels: levels, mix: mix, full: full, top: &top, loc: l}
	if f < memoMinFree {
		// Criterion 3d: where most of the node is busy, what its jobs
		// leave when they end matters as much as what is free now.
		if lt := longRunFor(t); lt != nil {
			tb.long, tb.longAll = lt, fullMask(t.Len())
		}
	}
	for i := range f {
		for j := range f {
			tb.row[i] += uint32(l.link[(i<<4|j)&0xFF])
		}
		tb.all += tb.row[i]
	}
	tb.all /= 2
	s := tb.choose(sc, ties)
	p.set, p.key = l.toPositions(s), q[s&0xFFFF]
	if f >= memoMinFree {
		memo.put(&mk, memoVal{set: s, key: p.key, bestAny: bestAny, found: true})
	}
	return p
}

// kindPick is exactPick from the node kind's tables, in position
// numbering: the same candidates, visited in the same order, with the
// same future per candidate, looked up instead of computed. On an idle
// node with every GPU eligible the candidates are precomputed too;
// otherwise a depth-first walk over the eligible GPUs collects them,
// cutting every branch whose GPUs already miss the best weakest link.
func kindPick(sc *scratch, kt *kindTable, free, cand uint32, k int, required topology.Link, mix *SizeMix) pick {
	f := bits.OnesCount32(free)
	levels := mix.levels(f, k)
	var top [exactMaxFree + 1]key
	for lv := levels; lv != 0; lv &= lv - 1 {
		j := bits.TrailingZeros32(lv)
		top[j] = kt.within[free][j]
	}
	bestAny := kt.within[cand][k]
	if k == 1 && cand != 0 {
		bestAny = singleKey
	}
	p := pick{bestAny: bestAny, anyExists: bestAny != 0}
	if bestAny == 0 || !bestAny.qualifies(k, required) {
		return p
	}
	tb := tieBreaker{q: &kt.q, levels: levels, mix: mix, full: free, top: &top, loc: &kt.loc, within: kt.within}
	for a := free; a != 0; a &= a - 1 {
		i := bits.TrailingZeros32(a)
		for b := free; b != 0; b &= b - 1 {
			tb.row[i&(exactMaxFree-1)] += uint32(kt.loc.link[(i<<4|bits.TrailingZeros32(b))&0xFF])
		}
		tb.all += tb.row[i&(exactMaxFree-1)]
	}
	tb.all /= 2
	var s uint32
	if full := uint32(1)<<kt.n - 1; free == full && cand == full {
		s = tb.chooseFrom(sc, kt.ties[k], true)
	} else {
		c := tieCollector{q: &kt.q, tb: &tb, k: k, weak: bestAny.weak(), out: sc.tied[:0]}
		c.findTwins(&kt.loc, free, cand)
		c.walk(cand, 0, 0)
		sc.tied = c.out
		s = tb.chooseFrom(sc, c.out, false)
	}
	p.found = true
	p.set, p.key = uint64(s), kt.q[s&0xFFFF]
	return p
}

// tieCollector gathers the k-subsets of a mask whose weakest link is weak
// (the best there is), with their criterion-2 and -4 values.
type tieCollector struct {
	q    *table
	tb   *tieBreaker
	k    int
	weak uint8
	out  []tied
	// lower[g] are g's twins at lower positions (see findTwins).
	lower [exactMaxFree]uint32
}

// findTwins records, per free GPU, its twins at lower positions: free
// GPUs that are both eligible or both not, with the same link to every
// other free GPU. Swapping two twins maps the free GPUs onto themselves
// with every link and eligibility kept, so a set and its image tie on
// every criterion but positions, and the one with the lower positions
// wins. Twins form classes, and so the winner takes the lowest GPUs of
// each class it uses: the walk only builds such sets. On symmetric nodes
// (all GPUs on one NVSwitch) that is one set per size instead of
// thousands.
func (c *tieCollector) findTwins(l *local, free, cand uint32) {
	for a := free; a != 0; a &= a - 1 {
		i := bits.TrailingZeros32(a) & (exactMaxFree - 1)
	next:
		for b := free & (1<<i - 1); b != 0; b &= b - 1 {
			j := bits.TrailingZeros32(b) & (exactMaxFree - 1)
			if cand>>i&1 != cand>>j&1 {
				continue
			}
			for x := free &^ (1<<i | 1<<j); x != 0; x &= x - 1 {
				g := bits.TrailingZeros32(x)
				if l.link[(i<<4|g)&0xFF] != l.link[(j<<4|g)&0xFF] {
					continue next
				}
			}
			c.lower[i] |= 1 << j
		}
	}
}

// walk extends set (size GPUs) with GPUs of left, lowest first, taking a
// GPU only after its lower twins. Adding a GPU never raises the weakest
// link, so a partial set below weak is cut.
func (c *tieCollector) walk(left, set uint32, size int) {
	if size == c.k {
		c.out = append(c.out, tied{set: set, agg: c.q[set&0xFFFF].agg(), rest: c.tb.restAgg(set)})
		return
	}
	need := c.k - size
	for m := left; bits.OnesCount32(m) >= need; {
		g := bits.TrailingZeros32(m)
		m &^= 1 << g
		if c.lower[g&(exactMaxFree-1)]&^set != 0 {
			continue
		}
		next := set | 1<<g
		if size >= 1 && c.q[next&0xFFFF].weak() < c.weak {
			continue
		}
		c.walk(m, next, size+1)
	}
}
