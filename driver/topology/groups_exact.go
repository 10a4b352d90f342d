package topology

import (
	"math/bits"
)

// exactSolver partitions up to exactGroupLimit items into groups of k (and
// len(items) mod k leftovers) by memoized search over subsets. The state is
// the set of items still unplaced; its lowest item either heads a group
// (every group through it is tried) or, while leftovers remain to be
// chosen, is left out. Because the objective is additive over groups (see
// partScore), the best completion of a state does not depend on how it was
// reached, which is what makes the memo exact.
//
// Ties are broken towards the lexicographically smallest partition (groups
// in canonical order, flattened): groups through the lowest item are tried
// in lexicographic order and leaving it out is tried last, each replacing
// the incumbent only when strictly better.
type exactSolver struct {
	k      int
	m      int
	links  []Link // m×m, indexed by item
	solved []bool
	best   []partScore
	choice []uint32 // the group picked in a state; 0 when its lowest item is left out
}

// solveExact returns the optimal groups (as positions) and their score.
func solveExact(t *Topology, items []int, k int) ([][]int, partScore) {
	m := len(items)
	s := &exactSolver{
		k:      k,
		m:      m,
		links:  make([]Link, m*m),
		solved: make([]bool, 1<<m),
		best:   make([]partScore, 1<<m),
		choice: make([]uint32, 1<<m),
	}
	for i, p := range items {
		for j, q := range items {
			s.links[i*m+j] = t.Link(p, q)
		}
	}
	full := uint32(1)<<m - 1
	score := s.solve(full)
	var groups [][]int
	for mask := full; mask != 0; {
		c := s.choice[mask]
		if c == 0 {
			mask &^= 1 << bits.TrailingZeros32(mask)
			continue
		}
		g := make([]int, 0, k)
		for rest := c; rest != 0; rest &= rest - 1 {
			g = append(g, items[bits.TrailingZeros32(rest)])
		}
		groups = append(groups, g)
		mask &^= c
	}
	return groups, score
}

func (s *exactSolver) solve(mask uint32) partScore {
	if mask == 0 {
		return partScore{}
	}
	if s.solved[mask] {
		return s.best[mask]
	}
	r := bits.OnesCount32(mask)
	low := bits.TrailingZeros32(mask)
	w := groupWalk{s: s, mask: mask}
	if r >= s.k {
		w.members[0] = low
		w.extend(low+1, 1, 1<<low, LinkNone, 0)
	}
	if r%s.k != 0 {
		cand := s.solve(mask &^ (1 << low))
		if !w.found || cand.better(w.best) {
			w.best, w.choice, w.found = cand, 0, true
		}
	}
	s.solved[mask] = true
	s.best[mask] = w.best
	s.choice[mask] = w.choice
	return w.best
}

// groupWalk enumerates, in lexicographic order, the groups of k items of
// one state that contain its lowest item, carrying the group's weakest link
// and link sum along so each candidate costs O(k) to score.
type groupWalk struct {
	s       *exactSolver
	mask    uint32
	members [exactGroupLimit]int
	best    partScore
	worst   Link // best.worstClass(), kept for pruning
	choice  uint32
	found   bool
}

func (w *groupWalk) extend(next, size int, group uint32, weakest Link, sum int) {
	s := w.s
	if size == s.k {
		cand := s.solve(w.mask&^group).add(weakest, sum)
		if !w.found || cand.better(w.best) {
			w.best, w.choice, w.found = cand, group, true
			w.worst = cand.worstClass()
		}
		return
	}
	need := s.k - size
	for q := next; q < s.m; q++ {
		if w.mask&(1<<q) == 0 {
			continue
		}
		if bits.OnesCount32(w.mask>>q) < need {
			break
		}
		wq, sq := weakest, sum
		row := s.links[q*s.m : (q+1)*s.m]
		for _, p := range w.members[:size] {
			l := row[p]
			if wq == LinkNone || l < wq {
				wq = l
			}
			sq += int(l)
		}
		// A group whose weakest link is already below every group of the
		// incumbent loses whatever the rest scores: the candidate has a
		// group at a class where the incumbent has none, and none of the
		// incumbent's groups sit lower. Its completions are skipped.
		if w.found && wq < w.worst {
			continue
		}
		w.members[size] = q
		w.extend(q+1, size+1, group|1<<q, wq, sq)
	}
}
