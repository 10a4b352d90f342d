package gangbench

import (
	"math/rand/v2"

	"github.com/gpulink/gpulink/driver/gang"
)

// state is the free GPUs of every node during a replay, bucketed by free
// count so that "a node with the most free GPUs" and "how many pods of g
// GPUs fit" take constant time.
type state struct {
	c      *Cluster
	free   []int
	byFree [GPUsPerNode + 1][]int
	pos    []int
	// nodes is driver/gang's view, refreshed per gpulink decision.
	nodes []gang.Node
	index map[string]int
	// demand is the shapes of the last jobs to arrive (gpulink's history).
	demand []gang.Shape
}

func newState(c *Cluster) *state {
	s := &state{c: c, free: make([]int, len(c.Nodes)), pos: make([]int, len(c.Nodes)), index: make(map[string]int, len(c.Nodes))}
	s.nodes = make([]gang.Node, len(c.Nodes))
	copy(s.nodes, c.Nodes)
	for i := range c.Nodes {
		s.free[i] = GPUsPerNode
		s.pos[i] = len(s.byFree[GPUsPerNode])
		s.byFree[GPUsPerNode] = append(s.byFree[GPUsPerNode], i)
		s.index[c.Nodes[i].Name] = i
	}
	return s
}

// move sets node i's free GPUs to f.
func (s *state) move(i, f int) {
	old := s.byFree[s.free[i]]
	last := old[len(old)-1]
	old[s.pos[i]] = last
	s.pos[last] = s.pos[i]
	s.byFree[s.free[i]] = old[:len(old)-1]
	s.free[i] = f
	s.pos[i] = len(s.byFree[f])
	s.byFree[f] = append(s.byFree[f], i)
}

func (s *state) take(i, g int) { s.move(i, s.free[i]-g) }
func (s *state) give(i, g int) { s.move(i, s.free[i]+g) }

// slots is how many pods of g GPUs fit in the whole cluster.
func (s *state) slots(g int) int {
	n := 0
	for f := g; f <= GPUsPerNode; f++ {
		n += len(s.byFree[f]) * (f / g)
	}
	return n
}

// leastAllocated is a node with the most free GPUs, at least g, ties
// broken at random (kube-scheduler's LeastAllocated score and its random
// choice among equal scores); -1 if none.
func (s *state) leastAllocated(g int, r *rand.Rand) int {
	for f := GPUsPerNode; f >= g; f-- {
		if b := s.byFree[f]; len(b) > 0 {
			return b[r.IntN(len(b))]
		}
	}
	return -1
}

// leastAllocatedIn is leastAllocated among nodes.
func (s *state) leastAllocatedIn(nodes []int, g int, r *rand.Rand) int {
	return s.leastAllocatedTaking(nodes, g, nil, r)
}

// leastAllocatedTaking is leastAllocatedIn with taken[i] of node i's free
// GPUs already promised (to earlier pods of the same job).
func (s *state) leastAllocatedTaking(nodes []int, g int, taken map[int]int, r *rand.Rand) int {
	best, bestFree, ties := -1, -1, 0
	for _, i := range nodes {
		f := s.free[i] - taken[i]
		if f < g {
			continue
		}
		switch {
		case f > bestFree:
			best, bestFree, ties = i, f, 1
		case f == bestFree:
			ties++
			if r.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}
