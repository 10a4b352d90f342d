package topology

// WeakestLink returns the slowest link between any two of the given
// positions: the class a collective over that set is bound by. It returns
// LinkNone for fewer than two distinct positions, where no pair exists.
// Repeated positions are ignored; positions must lie in [0, Len()).
func (t *Topology) WeakestLink(positions []int) Link {
	weakest := LinkNone
	for i, p := range positions {
		for _, q := range positions[i+1:] {
			if p == q {
				continue
			}
			if l := t.Link(p, q); weakest == LinkNone || l < weakest {
				weakest = l
			}
		}
	}
	return weakest
}

// LinkSum returns the sum of the Link values of all pairs of the given
// positions. It ranks sets that share the same weakest link: a larger sum
// means more of the pairs are on faster links. Repeated positions add
// nothing; positions must lie in [0, Len()).
func (t *Topology) LinkSum(positions []int) int {
	sum := 0
	for i, p := range positions {
		for _, q := range positions[i+1:] {
			sum += int(t.Link(p, q))
		}
	}
	return sum
}
