package topology

import "fmt"

// Subset returns the topology of the GPUs at the given positions, in
// that order, with the links among them. The kubelet plugin publishes the
// GPUs that are not in MIG mode as a node of their own: islands, aligned
// groups and link rows must not offer a GPU that is never given out
// whole.
func (t *Topology) Subset(positions []int) (*Topology, error) {
	gpus := make([]GPU, len(positions))
	links := make([][]Link, len(positions))
	for i, p := range positions {
		if p < 0 || p >= t.Len() {
			return nil, fmt.Errorf("subset: position %d out of range [0, %d)", p, t.Len())
		}
		gpus[i] = t.GPUs[p]
		links[i] = make([]Link, len(positions))
		for j, q := range positions {
			if i != j {
				links[i][j] = t.Link(p, q)
			}
		}
	}
	return New(gpus, links)
}
