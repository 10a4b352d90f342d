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
		r := m & (m - 1) // m without its lowest GPU a
		kk := singleKey
		if r != 0 {
			// Pairs of m are the pairs of m\{a}, of m\{b} and {a,b}, so
			// the weakest link takes O(1) and the aggregate follows by
			// inclusion-exclusion.
			a := bits.TrailingZeros32(m)
			b := bits.TrailingZeros32(r)
			lb := uint32(1) << b
			ab := l.link[(a<<4|b)&0xFF]
			qa, qb := q[r&0xFFFF], q[(m&^lb)&0xFFFF]
			kk = makeKey(min(qa.weak(), qb.weak(), ab), qa.agg()+qb.agg()-q[(r&^lb)&0xFFFF].agg()+uint32(ab))
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
