package planner

import (
	"math/bits"
	"slices"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// fragmentSearchBudget bounds the set extensions the fragmentation search
// may try for one node and size. Nodes of up to 16 GPUs need a few hundred
// at most; the bound only matters on large, irregular link graphs, where
// the figure is then left out rather than slowing down a scrape.
const fragmentSearchBudget = 1 << 16

// BestLink returns the weakest link of the set of k whole GPUs the allocator
// picks on this node when it is idle: the best link class a k-GPU request
// can get here. It depends on the topology only, so it is computed once per
// inventory (which is rebuilt when the node's slices change).
func (n *NodeInventory) BestLink(k int) (topology.Link, bool) {
	if k < 2 || k > n.Topo.Len() {
		return topology.LinkNone, false
	}
	n.bestMu.Lock()
	defer n.bestMu.Unlock()
	if l, ok := n.best[k]; ok {
		return l, true
	}
	r, err := allocate.Allocate(&allocate.NodeState{Name: n.Node, Topology: n.Topo},
		allocate.Request{GPUs: k}, allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack})
	if err != nil {
		return topology.LinkNone, false
	}
	if n.best == nil {
		n.best = map[int]topology.Link{}
	}
	n.best[k] = r.WeakestLink
	return r.WeakestLink, true
}

// IdleBest returns, per position, the best class c such that the GPU is in
// some set of k GPUs of the idle node whose every pair is linked at c or
// better (nil when the search ran over its budget). Cached per inventory.
func (n *NodeInventory) IdleBest(k int) []topology.Link {
	n.bestMu.Lock()
	defer n.bestMu.Unlock()
	if b, ok := n.idle[k]; ok {
		return b
	}
	all := uint64(1)<<n.Topo.Len() - 1
	if n.Topo.Len() == topology.MaxGPUs {
		all = ^uint64(0)
	}
	best := make([]topology.Link, n.Topo.Len())
	left := all
	budget := fragmentSearchBudget
	for _, c := range linkClasses(n.Topo) {
		if left == 0 {
			break
		}
		cov, ok := coverAt(n.Topo, all, k, c, &budget)
		if !ok {
			best = nil
			break
		}
		for m := left & cov; m != 0; m &= m - 1 {
			best[bits.TrailingZeros64(m)] = c
		}
		left &^= cov
	}
	if n.idle == nil {
		n.idle = map[int][]topology.Link{}
	}
	n.idle[k] = best
	return best
}

// linkClasses returns the classes of the topology's links, best first.
func linkClasses(t *topology.Topology) []topology.Link {
	seen := map[topology.Link]bool{}
	var out []topology.Link
	for i := range t.Len() {
		for j := i + 1; j < t.Len(); j++ {
			if l := t.Link(i, j); !seen[l] {
				seen[l] = true
				out = append(out, l)
			}
		}
	}
	slices.SortFunc(out, func(a, b topology.Link) int { return int(b) - int(a) })
	return out
}

// StrandedGPUs counts the GPUs of free (topology positions) that belong to
// no set of k GPUs of free whose every pair is linked at the class the GPU
// reaches for k on the idle node (idle, from idleBest): free GPUs that
// can no longer be combined into a k-GPU set as good as they could be part
// of. An idle node has none. It returns false when the search needed more
// set extensions than fragmentSearchBudget.
func StrandedGPUs(t *topology.Topology, free uint64, k int, idle []topology.Link) (int, bool) {
	if idle == nil {
		return 0, false
	}
	byClass := map[topology.Link]uint64{}
	for m := free; m != 0; m &= m - 1 {
		p := bits.TrailingZeros64(m)
		byClass[idle[p]] |= 1 << p
	}
	budget := fragmentSearchBudget
	stranded := 0
	for c, want := range byClass {
		cov, ok := coverAt(t, free, k, c, &budget)
		if !ok {
			return 0, false
		}
		stranded += bits.OnesCount64(want &^ cov)
	}
	return stranded, true
}

// coverAt returns the GPUs of within that belong to some set of k GPUs of
// within whose every pair is linked at class c or better, and false when
// that took more than *budget set extensions (which it decrements).
//
// For each GPU not covered by a set found before, it grows a clique of the
// graph "linked at >= c" on within that contains the GPU; every GPU of a
// clique found is covered. The search is exhaustive, so a GPU is left out
// only when no such set contains it.
func coverAt(t *topology.Topology, within uint64, k int, c topology.Link, budget *int) (uint64, bool) {
	if k <= 1 {
		return within, true
	}
	var adj [topology.MaxGPUs]uint64
	for rest := within; rest != 0; rest &= rest - 1 {
		i := bits.TrailingZeros64(rest)
		for others := within &^ (1 << i); others != 0; others &= others - 1 {
			if j := bits.TrailingZeros64(others); t.Link(i, j) >= c {
				adj[i] |= 1 << j
			}
		}
	}
	var covered uint64
	var grow func(set uint64, size int, cand uint64) bool
	grow = func(set uint64, size int, cand uint64) bool {
		if size == k {
			covered |= set
			return true
		}
		for cand != 0 && size+bits.OnesCount64(cand) >= k {
			if *budget--; *budget < 0 {
				return false
			}
			u := bits.TrailingZeros64(cand)
			cand &^= 1 << u
			if grow(set|1<<u, size+1, cand&adj[u]) {
				return true
			}
		}
		return false
	}
	for rest := within; rest != 0; rest &= rest - 1 {
		v := bits.TrailingZeros64(rest)
		if covered&(1<<v) != 0 {
			continue
		}
		grow(1<<v, 1, adj[v])
		if *budget < 0 {
			return 0, false
		}
	}
	return covered, true
}
