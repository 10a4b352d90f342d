package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// beamWidth bounds the partial sets kept per step of the heuristic search
// for link-class components larger than the exact search handles. A step
// then expands at most 64*63 sets, so one search stays around a
// millisecond for 32 GPUs, and every GPU of a 64-GPU node can seed one.
const beamWidth = 64

type beamState struct {
	set uint64
	// rank is set with its bits reversed: among sets of equal size, the
	// one with the lowest positions has the highest rank, so ordering is
	// two integer comparisons.
	rank uint64
	key  key
}

func newBeamState(set uint64, k key) beamState {
	return beamState{set: set, rank: bits.Reverse64(set), key: k}
}

// better orders states: higher key, then lowest positions.
func (a beamState) better(b beamState) bool {
	if a.key != b.key {
		return a.key > b.key
	}
	return a.rank > b.rank
}

// beamSearch grows sets one GPU at a time, keeping beamWidth partial sets
// (see selectBeam) and dropping any that already misses the required link,
// which can only get worse as GPUs are added. Among equally good final
// sets it keeps the one with the smallest cut to the other free GPUs (see
// cut), then lowest positions. The result is deterministic but not
// guaranteed optimal.
func beamSearch(sc *scratch, t *topology.Topology, free, cand uint64, k int, required topology.Link) pick {
	cur := sc.cur[:0]
	for m := cand; m != 0; m &= m - 1 {
		cur = append(cur, newBeamState(uint64(1)<<bits.TrailingZeros64(m), singleKey))
	}
	next := sc.next[:0]
	for size := 2; size <= k && len(cur) > 0; size++ {
		next = next[:0]
		sc.seen.reset(len(cur) * bits.OnesCount64(cand))
		for _, s := range cur {
			for m := cand &^ s.set; m != 0; m &= m - 1 {
				g := bits.TrailingZeros64(m)
				child := s.set | 1<<g
				if !sc.seen.insert(child) {
					continue
				}
				w, agg := s.key.weak(), s.key.agg()
				for a := s.set; a != 0; a &= a - 1 {
					l := uint8(t.Link(bits.TrailingZeros64(a), g))
					w = min(w, l)
					agg += uint32(l)
				}
				if topology.Link(w) < required {
					continue
				}
				next = append(next, newBeamState(child, makeKey(w, agg)))
			}
		}
		if size < k && len(next) > beamWidth {
			next = sc.selectBeam(next, bits.OnesCount64(cand))
		}
		cur, next = next, cur
	}
	sc.cur, sc.next = cur, next
	if len(cur) == 0 {
		return pick{}
	}
	var top key
	for _, s := range cur {
		top = max(top, s.key)
	}
	var best beamState
	var bestCut uint32
	for _, s := range cur {
		if s.key != top {
			continue
		}
		c := cut(t, s.set, free&^s.set)
		if best.set == 0 || c < bestCut || (c == bestCut && s.rank > best.rank) {
			best, bestCut = s, c
		}
	}
	return pick{set: best.set, key: best.key, found: true}
}

// maxPerAnchor caps selectBeam's per-anchor quota; with more than
// beamWidth states there are at least 9 candidate GPUs, so the quota
// beamWidth/candidates is at most 7.
const maxPerAnchor = 8

// selectBeam keeps beamWidth of next: first the best beamWidth/candidates
// (at least 1) per lowest GPU, then the best of the rest. Keeping only
// the overall best would keep only the lowest positions among equal
// states, and on nodes made of identical islands that drops every island
// but the first before any set is big enough to tell them apart. It runs
// in linear time plus a heap of beamWidth, instead of sorting next.
func (sc *scratch) selectBeam(next []beamState, candidates int) []beamState {
	perAnchor := min(maxPerAnchor, max(1, beamWidth/candidates))
	var quota [64][maxPerAnchor]int32
	var count [64]int
	for i, s := range next {
		a := bits.TrailingZeros64(s.set)
		q := quota[a][:count[a]]
		switch {
		case count[a] < perAnchor:
			count[a]++
			q = quota[a][:count[a]]
		case s.better(next[q[len(q)-1]]):
		default:
			continue
		}
		// Insert i into the anchor's list, kept best first.
		j := len(q) - 1
		for ; j > 0 && s.better(next[q[j-1]]); j-- {
			q[j] = q[j-1]
		}
		q[j] = int32(i)
	}
	kept := sc.kept[:0]
	if cap(sc.chosen) < len(next) {
		sc.chosen = make([]bool, len(next))
	}
	chosen := sc.chosen[:len(next)]
	clear(chosen)
	for a := range quota {
		for _, i := range quota[a][:count[a]] {
			chosen[i] = true
			kept = append(kept, next[i])
		}
	}
	h := sc.heap[:0]
	for i, s := range next {
		if !chosen[i] {
			h.offer(s, beamWidth-len(kept))
		}
	}
	kept = append(kept, h...)
	sc.kept, sc.chosen, sc.heap = next[:0], chosen, h[:0]
	return kept
}

// beamHeap is a min-heap (worst state at the root) that keeps the best
// states offered, up to a limit.
type beamHeap []beamState

func (h *beamHeap) offer(s beamState, limit int) {
	if limit <= 0 {
		return
	}
	if len(*h) < limit {
		*h = append(*h, s)
		h.up(len(*h) - 1)
		return
	}
	if !s.better((*h)[0]) {
		return
	}
	(*h)[0] = s
	h.down(0)
}

func (h beamHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h[p].better(h[i]) {
			return
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
}

func (h beamHeap) down(i int) {
	for {
		w := i
		if l := 2*i + 1; l < len(h) && h[w].better(h[l]) {
			w = l
		}
		if r := 2*i + 2; r < len(h) && h[w].better(h[r]) {
			w = r
		}
		if w == i {
			return
		}
		h[w], h[i] = h[i], h[w]
		i = w
	}
}

// setTable is an open-addressing set of GPU sets, so a child reached from
// several parents is expanded once. Sets are never 0, which marks a free slot.
type setTable struct {
	slots []uint64
	shift uint
}

func (h *setTable) reset(n int) {
	size := 16
	for size < 2*n {
		size *= 2
	}
	if cap(h.slots) < size {
		h.slots = make([]uint64, size)
	}
	h.slots = h.slots[:size]
	clear(h.slots)
	h.shift = uint(64 - bits.TrailingZeros(uint(size)))
}

// insert adds set and reports whether it was new.
func (h *setTable) insert(set uint64) bool {
	mask := uint64(len(h.slots) - 1)
	for i := (set * 0x9E3779B97F4A7C15) >> h.shift; ; i = (i + 1) & mask {
		switch h.slots[i] {
		case 0:
			h.slots[i] = set
			return true
		case set:
			return false
		}
	}
}
