package topology

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
