package topology

// nvlinkIslands returns the connected components of the graph whose edges
// are NVLink bonds, each ascending and ordered by lowest position, and the
// island ID of every position. Components rather than cliques: two GPUs
// that reach each other only through a third one still share an NVLink
// fabric (peer traffic can be routed), while a GPU with no NVLink at all
// talks to the rest over PCIe only.
func nvlinkIslands(t *Topology) ([][]int, []int) {
	n := t.Len()
	islandOf := make([]int, n)
	for p := range islandOf {
		islandOf[p] = -1
	}
	var islands [][]int
	stack := make([]int, 0, n)
	for start := range n {
		if islandOf[start] >= 0 {
			continue
		}
		id := len(islands)
		islandOf[start] = id
		members := []int{start}
		stack = append(stack[:0], start)
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for q := range n {
				if islandOf[q] < 0 && t.Link(p, q).IsNVLink() {
					islandOf[q] = id
					members = append(members, q)
					stack = append(stack, q)
				}
			}
		}
		islands = append(islands, sortedInts(members))
	}
	return islands, islandOf
}

// Islands returns the NVLink islands: the connected components of the
// NVLink graph, as positions. Each island is ascending, islands are ordered
// by their lowest position, and a GPU without NVLink is an island of one.
// The result is a copy the caller may modify.
func (t *Topology) Islands() [][]int {
	out := make([][]int, len(t.islands))
	for i, isl := range t.islands {
		out[i] = append([]int(nil), isl...)
	}
	return out
}

// IslandOf returns the ID (index into Islands()) of the island holding
// position p, or -1 when p is not a position of t.
func (t *Topology) IslandOf(p int) int {
	if p < 0 || p >= t.Len() {
		return -1
	}
	return t.islandOf[p]
}

// sortedInts sorts s in place (insertion sort: islands and groups are
// small, and this keeps the hot paths free of closures) and returns it.
func sortedInts(s []int) []int {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}
