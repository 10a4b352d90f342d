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
