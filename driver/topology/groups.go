package topology

import (
	"math/bits"
	"sort"
)

// exactGroupLimit is the largest node (or, in the heuristic, the largest
// union of groups) that AlignedGroups partitions exactly. The exact search
// keeps one memo entry per subset, 2^16 of them at this limit.
const exactGroupLimit = 16

// maxRefinePasses bounds the heuristic's improvement loop. Every accepted
// change strictly improves the objective, so the loop also ends on its own;
// the bound only caps the running time on adversarial matrices.
const maxRefinePasses = 16

// alignedPartition is the cached answer of AlignedGroups for one k.
type alignedPartition struct {
	groups  [][]int
	groupOf []int // group ID per position, -1 for leftovers
}

// GroupSizes returns the group sizes the kubelet plugin publishes aligned
// groups for on a node of n GPUs: the powers of two 2, 4, 8, ... below n.
//
// n itself is left out even when it is a power of two: a group holding
// every GPU gives every device the same ID, so matching on it constrains
// nothing that "same node" does not already.
func GroupSizes(n int) []int {
	var sizes []int
	for k := 2; k < n; k *= 2 {
		sizes = append(sizes, k)
	}
	return sizes
}

// AlignedGroups partitions the positions into Len()/k disjoint groups of k
// GPUs that are best connected by the objective in the package
// documentation; the Len() mod k GPUs whose exclusion helps most are in no
// group. Groups are ascending and ordered by their lowest position. It
// returns nil when k < 1 or k > Len(). The result is a copy the caller may
// modify; the partition itself is computed once per k and cached.
func (t *Topology) AlignedGroups(k int) [][]int {
	part := t.aligned(k)
	out := make([][]int, len(part.groups))
	for i, g := range part.groups {
		out[i] = append([]int(nil), g...)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// GroupOf returns the ID (index into AlignedGroups(k)) of the group of
// size k that holds position p. ok is false when p is one of the leftover
// GPUs, p is not a position of t, or k is out of range.
func (t *Topology) GroupOf(k, p int) (id int, ok bool) {
	if p < 0 || p >= t.Len() {
		return -1, false
	}
	part := t.aligned(k)
	if part.groupOf == nil || part.groupOf[p] < 0 {
		return -1, false
	}
	return part.groupOf[p], true
}

func (t *Topology) aligned(k int) *alignedPartition {
	if k < 1 || k > t.Len() {
		return &alignedPartition{}
	}
	if t.derived == nil {
		return computeAligned(t, k)
	}
	// Holding the lock while computing makes concurrent first callers for
	// the same k wait for one computation instead of racing to repeat it;
	// that costs milliseconds once per k (up to about a hundred on a
	// 64-GPU node), after which every call is a map lookup.
	t.derived.mu.Lock()
	defer t.derived.mu.Unlock()
	if part, ok := t.derived.groups[k]; ok {
		return part
	}
	part := computeAligned(t, k)
	t.derived.groups[k] = part
	return part
}

func computeAligned(t *Topology, k int) *alignedPartition {
	n := t.Len()
	var groups [][]int
	switch {
	case k == 1:
		for p := range n {
			groups = append(groups, []int{p})
		}
	case uniformLinks(t):
		// Every partition scores the same (NVSwitch nodes), so the
		// tie-break alone decides: consecutive positions, leftovers last.
		for g := range n / k {
			group := make([]int, k)
			for i := range group {
				group[i] = g*k + i
			}
			groups = append(groups, group)
		}
	case n <= exactGroupLimit:
		all := make([]int, n)
		for p := range all {
			all[p] = p
		}
		groups, _ = solveExact(t, all, k)
	default:
		groups = solveHeuristic(t, k)
	}
	for _, g := range groups {
		sortedInts(g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i][0] < groups[j][0] })
	part := &alignedPartition{groups: groups, groupOf: make([]int, n)}
	for p := range part.groupOf {
		part.groupOf[p] = -1
	}
	for id, g := range groups {
		for _, p := range g {
			part.groupOf[p] = id
		}
	}
	return part
}

// uniformLinks reports whether every pair of GPUs has the same link class.
func uniformLinks(t *Topology) bool {
	n := t.Len()
	for p := range n {
		for q := p + 1; q < n; q++ {
			if t.Link(p, q) != t.Link(0, 1) {
				return false
			}
		}
	}
	return true
}

// partScore is the objective value of a set of groups. hi and lo hold one
// 4-bit count per link class, the worst class (SYS) in the most significant
// nibble of hi and NV18 at the low end of lo, so that comparing (hi, lo) as
// one 128-bit number compares the count vectors from the worst class up:
// for sets with the same number of groups that is exactly the leximin order
// on sorted weakest links (fewer groups stuck at the worst class wins, then
// at the next class, ...). Counts never exceed 8 (at most 16 GPUs in groups
// of 2 or more are scored at once), so nibbles cannot carry into each other.
// sum is the total LinkSum, the secondary criterion.
type partScore struct {
	hi, lo uint64
	sum    int
}

func (s partScore) add(weakest Link, linkSum int) partScore {
	c := int(weakest)
	if c <= 16 {
		s.hi += 1 << (4 * (16 - c))
	} else {
		s.lo += 1 << (4 * (32 - c))
	}
	s.sum += linkSum
	return s
}

// worstClass returns the worst weakest link among the scored groups, or
// LinkNone when no group has been scored.
func (s partScore) worstClass() Link {
	switch {
	case s.hi != 0:
		return Link(1 + bits.LeadingZeros64(s.hi)/4)
	case s.lo != 0:
		return Link(17 + bits.LeadingZeros64(s.lo)/4)
	}
	return LinkNone
}

// better reports whether s is strictly better than o.
func (s partScore) better(o partScore) bool {
	if s.hi != o.hi {
		return s.hi < o.hi
	}
	if s.lo != o.lo {
		return s.lo < o.lo
	}
	return s.sum > o.sum
}

// scoreGroups scores a few groups; partScore counts overflow past 15
// groups per class, which the callers (one or two groups) never reach.
func scoreGroups(t *Topology, groups ...[]int) partScore {
	var s partScore
	for _, g := range groups {
		s = s.add(t.WeakestLink(g), t.LinkSum(g))
	}
	return s
}

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

// solveHeuristic partitions nodes above exactGroupLimit GPUs. It is
// deterministic and runs in O(n³) for the construction plus at most
// maxRefinePasses refinement passes:
//
//  1. Greedy construction: repeatedly take the best group of k that can be
//     grown from any free GPU (seeded at each free GPU in turn, adding the
//     free GPU whose weakest link to the group, then link sum, is largest,
//     lowest position on ties), comparing groups by weakest link then link
//     sum. Best-first suits the hierarchical wiring of real nodes: islands
//     and PCIe switches are used up before groups have to span them.
//  2. Refinement: for every two groups, re-partition their union exactly
//     when 2k ≤ exactGroupLimit, otherwise try every swap of one member
//     between them; likewise for each group together with the leftovers,
//     so the leftovers end up being the GPUs whose exclusion helps most.
//     A change is kept only when it strictly improves the two groups'
//     score, which (the objective being additive over groups) strictly
//     improves the whole partition.
func solveHeuristic(t *Topology, k int) [][]int {
	groups, leftovers := greedyGroups(t, k)
	// A pair (or a group with the leftovers) that was examined and left
	// alone cannot improve until one side changes, so each side carries a
	// version and a pair is re-examined only when a version moved.
	version := make([]int, len(groups))
	leftoverVersion := 0
	type seen struct{ a, b int }
	pairSeen := make([][]seen, len(groups))
	for i := range pairSeen {
		pairSeen[i] = make([]seen, len(groups))
		for j := range pairSeen[i] {
			pairSeen[i][j] = seen{-1, -1}
		}
	}
	leftSeen := make([]seen, len(groups))
	for i := range leftSeen {
		leftSeen[i] = seen{-1, -1}
	}
	for range maxRefinePasses {
		improved := false
		for i := range groups {
			for j := i + 1; j < len(groups); j++ {
				if pairSeen[i][j] == (seen{version[i], version[j]}) {
					continue
				}
				if refinePair(t, k, groups, i, j) {
					// Not marked as seen: one sweep of swaps may leave
					// further improvements for the next pass.
					version[i]++
					version[j]++
					improved = true
					continue
				}
				pairSeen[i][j] = seen{version[i], version[j]}
			}
		}
		if len(leftovers) > 0 {
			for i := range groups {
				if leftSeen[i] == (seen{version[i], leftoverVersion}) {
					continue
				}
				if refineLeftovers(t, k, groups, i, leftovers) {
					version[i]++
					leftoverVersion++
					improved = true
					continue
				}
				leftSeen[i] = seen{version[i], leftoverVersion}
			}
		}
		if !improved {
			break
		}
	}
	return groups
}

func greedyGroups(t *Topology, k int) (groups [][]int, leftovers []int) {
	n := t.Len()
	free := make([]bool, n)
	for p := range free {
		free[p] = true
	}
	g := grower{t: t, free: free, minTo: make([]Link, n), sumTo: make([]int, n), in: make([]bool, n)}
	for range n / k {
		var best []int
		var bestScore partScore
		for seed := range n {
			if !free[seed] {
				continue
			}
			cand := g.grow(seed, k)
			if sc := scoreGroups(t, cand); best == nil || sc.better(bestScore) {
				best, bestScore = cand, sc
			}
		}
		for _, p := range best {
			free[p] = false
		}
		groups = append(groups, best)
	}
	for p, f := range free {
		if f {
			leftovers = append(leftovers, p)
		}
	}
	return groups, leftovers
}

// grower holds the scratch state for growing one group greedily.
type grower struct {
	t     *Topology
	free  []bool
	minTo []Link // weakest link from a candidate to the group so far
	sumTo []int  // link sum from a candidate to the group so far
	in    []bool
}

func (g *grower) grow(seed, k int) []int {
	t := g.t
	group := []int{seed}
	for q := range g.in {
		g.in[q] = false
		g.minTo[q] = t.Link(seed, q)
		g.sumTo[q] = int(g.minTo[q])
	}
	g.in[seed] = true
	for len(group) < k {
		pick := -1
		for q, f := range g.free {
			if !f || g.in[q] {
				continue
			}
			if pick < 0 || g.minTo[q] > g.minTo[pick] || (g.minTo[q] == g.minTo[pick] && g.sumTo[q] > g.sumTo[pick]) {
				pick = q
			}
		}
		g.in[pick] = true
		group = append(group, pick)
		for q := range g.in {
			if l := t.Link(pick, q); l < g.minTo[q] {
				g.minTo[q] = l
			}
			g.sumTo[q] += int(t.Link(pick, q))
		}
	}
	return group
}

// refinePair improves groups i and j in place; it reports whether it did.
func refinePair(t *Topology, k int, groups [][]int, i, j int) bool {
	cur := scoreGroups(t, groups[i], groups[j])
	if 2*k <= exactGroupLimit {
		union := sortedInts(append(append([]int(nil), groups[i]...), groups[j]...))
		res, sc := solveExact(t, union, k)
		if !sc.better(cur) {
			return false
		}
		groups[i], groups[j] = res[0], res[1]
		return true
	}
	improved := false
	a, b := groups[i], groups[j]
	for x := range a {
		for y := range b {
			a[x], b[y] = b[y], a[x]
			if sc := scoreGroups(t, a, b); sc.better(cur) {
				cur, improved = sc, true
				continue
			}
			a[x], b[y] = b[y], a[x]
		}
	}
	return improved
}

// refineLeftovers improves group i by trading members with the leftovers
// (updated in place); it reports whether it did. Leftovers carry no score,
// so only the group's own score decides.
func refineLeftovers(t *Topology, k int, groups [][]int, i int, leftovers []int) bool {
	cur := scoreGroups(t, groups[i])
	if k+len(leftovers) <= exactGroupLimit {
		union := sortedInts(append(append([]int(nil), groups[i]...), leftovers...))
		res, sc := solveExact(t, union, k)
		if !sc.better(cur) {
			return false
		}
		groups[i] = res[0]
		in := make(map[int]bool, k)
		for _, p := range res[0] {
			in[p] = true
		}
		rest := leftovers[:0]
		for _, p := range union {
			if !in[p] {
				rest = append(rest, p)
			}
		}
		return true
	}
	improved := false
	a := groups[i]
	for x := range a {
		for y := range leftovers {
			a[x], leftovers[y] = leftovers[y], a[x]
			if sc := scoreGroups(t, a); sc.better(cur) {
				cur, improved = sc, true
				continue
			}
			a[x], leftovers[y] = leftovers[y], a[x]
		}
	}
	return improved
}
