package planner

import (
	"sync"

	"github.com/gpulink/gpulink/driver/allocate"
)

// usageCache keeps each node's GPU usage as a weighing of the demand mix
// last read it from the ledger, with the pool's usage generation it was
// read at. A weighing (nodesNow) reads every GPU node, most of them
// unchanged since the one before; reading each device's usage from the
// ledger (a map lookup by pool and device name per GPU, and a slice per
// node) was two thirds of a weighing's CPU in `make scale`'s profile,
// and weighings are among the slowest decisions while the mix is young.
// The usage slices it returns are shared between weighings: read only
// (allocate.DemandMix.WithScarcity only reads them).
type usageCache struct {
	mu      sync.Mutex
	entries map[*NodeInventory]cachedUsage
}

type cachedUsage struct {
	gen   uint64
	usage []allocate.GPUUsage
}

func newUsageCache() *usageCache {
	return &usageCache{entries: map[*NodeInventory]cachedUsage{}}
}

// reader returns the ledger's usage of the nodes, read again only for
// those whose pool's usage generation moved since the cache read them.
// The generations of all of them are read first, under one lock of the
// ledger (Ledger.Generations): a change after that is stored under the
// older generation and read again next time, never missed. A node not in
// nodes is read from the ledger.
func (c *usageCache) reader(l *Ledger, nodes []*NodeInventory) func(*NodeInventory) []allocate.GPUUsage {
	gens := make([]uint64, len(nodes))
	l.Generations(nodes, gens)
	c.mu.Lock()
	for i, n := range nodes {
		if e, ok := c.entries[n]; !ok || e.gen != gens[i] {
			c.entries[n] = cachedUsage{gen: gens[i], usage: l.NodeUsage(n)}
		}
	}
	c.mu.Unlock()
	return func(n *NodeInventory) []allocate.GPUUsage {
		c.mu.Lock()
		e, ok := c.entries[n]
		c.mu.Unlock()
		if !ok {
			return l.NodeUsage(n)
		}
		return e.usage
	}
}

// prune forgets the nodes not in nodes once the cache holds many more
// than nodes: a node's inventory is replaced when its slices change, and
// the old one is never asked for again.
func (c *usageCache) prune(nodes []*NodeInventory) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) <= 2*len(nodes)+64 {
		return
	}
	keep := make(map[*NodeInventory]cachedUsage, len(nodes))
	for _, n := range nodes {
		if e, ok := c.entries[n]; ok {
			keep[n] = e
		}
	}
	c.entries = keep
}
