package allocate

import (
	"math/bits"
	"slices"
	"sync"

	"github.com/gpulink/gpulink/driver/topology"
)

// kindMaxEntries bounds the kinds kept (each about 5.5 MiB at 16 GPUs);
// when full the store is emptied and refilled by Prepare and searches.
const kindMaxEntries = 16

// kindTable is what an exact search on an idle node needs that depends
// only on the node's kind (its link matrix): on an idle node every GPU is
// free, so the search's local numbering is the position numbering and
// these tables are exactly what the search would compute (doc.go,
// "Node kinds").
type kindTable struct {
	n int
	// loc is the kind's links in position numbering (every GPU free).
	loc local
	// q is the quality of every subset, as the search's pass computes it.
	q table
	// within[m][j] is the best quality of a j-subset of m: criterion 3's
	// scan of a rest's subsets becomes one lookup.
	within [][exactMaxFree + 1]key
	// ties[k] are the k-subsets with the best weakest link, in the order
	// criterion 3 visits them (tied.before); best[k] is their quality's
	// best (the best k-subset).
	ties [exactMaxFree + 1][]tied
	best [exactMaxFree + 1]key
}

type kindKey struct {
	links [exactMaxFree * exactMaxFree]uint8
	n     uint8
}

type kindStore struct {
	mu    sync.Mutex
	kinds map[kindKey]*kindTable
	off   bool // for tests and benchmarks of the search without it
}

var kinds = &kindStore{kinds: map[kindKey]*kindTable{}}

// Prepare precomputes the exact search's tables for the node kind of t
// (memoMinFree to 16 GPUs; others need none), so that decisions on idle
// nodes of that kind, including the first, skip the search's pass over
// every subset. Nodes of one kind share the work; a controller calls it
// when it learns a node's topology, outside its decisions. It is safe for
// concurrent use and cheap once a kind is known. It lists criterion 3d's
// ideal sets of the kind too (nodes of up to 16 GPUs; about 10 ms at 16).
func Prepare(t *topology.Topology) {
	longRunFor(t)
	n := t.Len()
	if n < memoMinFree || n > exactMaxFree {
		return
	}
	var l local
	l.load(t, fullMask(n))
	kinds.get(&l, true)
}

func makeKindKey(l *local) kindKey {
	k := kindKey{n: uint8(l.f)}
	for i := range l.f {
		copy(k.links[i*exactMaxFree:i*exactMaxFree+l.f], l.link[i<<4:i<<4+l.f])
	}
	return k
}

// get returns the kind's tables, building them when build is set.
func (s *kindStore) get(l *local, build bool) *kindTable {
	key := makeKindKey(l)
	s.mu.Lock()
	if s.off {
		s.mu.Unlock()
		return nil
	}
	kt := s.kinds[key]
	s.mu.Unlock()
	if kt != nil || !build {
		return kt
	}
	kt = buildKind(l)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.kinds) >= kindMaxEntries {
		clear(s.kinds)
	}
	s.kinds[key] = kt
	return kt
}

// buildKind computes a kind's tables with the search's own arithmetic
// (pairsKey), so that every value equals what the search computes.
func buildKind(l *local) *kindTable {
	n := l.f
	full := uint32(1)<<n - 1
	kt := &kindTable{n: n, loc: *l, within: make([][exactMaxFree + 1]key, full+1)}
	q := &kt.q
	q[0] = singleKey
	for m := uint32(1); m <= full; m++ {
		r := m & (m - 1) // m without its lowest GPU
		kk := singleKey
		if r != 0 {
			kk = l.pairsKey(q, m, r)
		}
		q[m&0xFFFF] = kk
		pc := bits.OnesCount32(m)
		w := &kt.within[m]
		*w = kt.within[r]
		for x := m; x != 0; x &= x - 1 {
			sub := &kt.within[m&^(1<<bits.TrailingZeros32(x))]
			for j := 2; j < pc; j++ {
				w[j] = max(w[j], sub[j])
			}
		}
		w[pc] = kk
		switch b := kt.best[pc]; {
		case b == 0 || kk.weak() > b.weak():
			kt.ties[pc] = append(kt.ties[pc][:0], tied{set: m})
		case kk.weak() == b.weak():
			kt.ties[pc] = append(kt.ties[pc], tied{set: m})
		}
		kt.best[pc] = max(kt.best[pc], kk)
	}
	var row [exactMaxFree]uint32
	var all uint32
	for i := range n {
		for j := range n {
			row[i] += uint32(l.link[(i<<4|j)&0xFF])
		}
		all += row[i]
	}
	all /= 2
	for k := range kt.ties {
		for i := range kt.ties[k] {
			c := &kt.ties[k][i]
			c.agg = q[c.set&0xFFFF].agg()
			var rows uint32
			for m := c.set; m != 0; m &= m - 1 {
				rows += row[bits.TrailingZeros32(m)&(exactMaxFree-1)]
			}
			c.rest = all + c.agg - rows
		}
		slices.SortFunc(kt.ties[k], cmpTied)
		kt.ties[k] = slices.Clip(kt.ties[k])
	}
	return kt
}
