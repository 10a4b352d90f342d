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

// reader returns the ledger's usage of a node, read again only when its
// pool's generation moved since the cache read it. The generation is
// read before the usage: a change between the two is stored under the
// older generation and read again next time, never missed.
func (c *usageCache) reader(l *Ledger) func(*NodeInventory) []allocate.GPUUsage {
	return func(n *NodeInventory) []allocate.GPUUsage {
		gen := l.PoolGeneration(n.Pool)
		c.mu.Lock()
		defer c.mu.Unlock()
		if e, ok := c.entries[n]; ok && e.gen == gen {
			return e.usage
		}
		u := l.NodeUsage(n)
		c.entries[n] = cachedUsage{gen: gen, usage: u}
		return u
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
