package controller

import (
	"strconv"
	"sync"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/topology"
)

// Allocations' weakest_link values that do not name a link class.
const (
	weakestLinkShare = "share"
	weakestLinkMIG   = "mig"
)

// linkSeries remembers the kinds of node (their GPUs' link matrices) whose
// allocations_total and below_best_link_total series are exported. A
// counter series that first appears at 1 reads as no increase to rate()
// and increase(), so the first allocation of a kind, often the one an
// operator looks for (the first request that got a weaker set than the
// node could give), would not show on the dashboard. The label values are
// open-ended across nodes but known for each kind: the link classes among
// its GPU pairs, and for k GPUs those below its best set of k. They are
// exported at 0 when a kind is first seen.
type linkSeries struct {
	mu   sync.Mutex
	seen map[string]bool
}

// seedLinkSeries exports the series a node's allocations can produce, once
// per kind of node.
func (c *Controller) seedLinkSeries(n *planner.NodeInventory) {
	if n == nil || n.Topo == nil || n.Topo.Len() == 0 {
		return
	}
	key := linkMatrixKey(n.Topo)
	s := &c.linkSeries
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[key] {
		return
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[key] = true
	classes := linkClasses(n.Topo)
	for _, l := range classes {
		c.metrics.Allocations.WithLabelValues(l.String())
	}
	for k := 2; k <= n.Topo.Len(); k++ {
		best, ok := n.BestLink(k)
		if !ok {
			continue
		}
		for _, l := range classes {
			if l < best {
				c.metrics.BelowBestLink.WithLabelValues(strconv.Itoa(k), l.String())
			}
		}
	}
}

// linkMatrixKey identifies a kind of node by its GPUs' pairwise links.
func linkMatrixKey(t *topology.Topology) string {
	n := t.Len()
	b := make([]byte, 0, 1+n*(n-1)/2)
	b = append(b, byte(n))
	for i := range n {
		for j := i + 1; j < n; j++ {
			b = append(b, byte(t.Link(i, j)))
		}
	}
	return string(b)
}

// linkClasses returns the link classes among the topology's GPU pairs,
// weakest first.
func linkClasses(t *topology.Topology) []topology.Link {
	var present [256]bool
	for i := range t.Len() {
		for j := i + 1; j < t.Len(); j++ {
			present[t.Link(i, j)] = true
		}
	}
	var out []topology.Link
	for l := range present {
		if present[l] && topology.Link(l).Valid() {
			out = append(out, topology.Link(l))
		}
	}
	return out
}
