package planner

import (
	"sync"

	"github.com/gpulink/gpulink/driver/allocate"
)

// scoreCache keeps node scores per request shape and policy, bounded to
// the shapes most recently asked for.
type scoreCache struct {
	mu     sync.Mutex
	shapes *lru[*shapeScores]
	// all is the inventory's whole node list as Planner.Decide last saw
	// it: a decision over it ranks with the shape's rankIndex.
	all []*NodeInventory
	// positions are the pools' positions in it, for every index.
	positions poolPositions
}

// maxCachedShapes bounds the request shapes whose scores are kept: a
// shape costs about 100 bytes per node.
const maxCachedShapes = 32

func newScoreCache() *scoreCache {
	return &scoreCache{shapes: newLRU[*shapeScores](maxCachedShapes)}
}

// entries counts the node scores the cache keeps.
func (c *scoreCache) entries() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for e := c.shapes.order.Front(); e != nil; e = e.Next() {
		s := e.Value.(*lruEntry[*shapeScores]).val
		s.mu.Lock()
		n += len(s.byNode)
		s.mu.Unlock()
	}
	return n
}

// inventory tells the cache the inventory's whole node list (a decision
// over another list, restricted to some nodes, ranks them afresh).
func (c *scoreCache) inventory(nodes []*NodeInventory) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.all = nodes
	c.mu.Unlock()
}

// indexFor returns the shape's ranked index when nodes is the inventory's
// whole list, nil otherwise.
func (c *scoreCache) indexFor(s *shapeScores, nodes []*NodeInventory) *rankIndex {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	all := c.all
	c.mu.Unlock()
	if !sameList(all, nodes) || len(nodes) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.index == nil {
		s.index = &rankIndex{positions: &c.positions}
	}
	return s.index
}

// shape returns the scores kept for a shape; a nil cache keeps nothing.
func (c *scoreCache) shape(key string, nodes int) *shapeScores {
	if c == nil {
		return &shapeScores{byNode: make(map[string]*scoreEntry, nodes)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.shapes.get(key)
	if !ok {
		s = &shapeScores{byNode: make(map[string]*scoreEntry, nodes)}
		c.shapes.put(key, s)
	}
	return s
}

// shapeScores are the scores of one shape by node name. Decisions are
// serialized, so a shape's entries are used by one decision at a time; the
// lock only guards against a test or caller that does not.
type shapeScores struct {
	mu     sync.Mutex
	byNode map[string]*scoreEntry
	// index ranks the shape's scores over the inventory's whole node list
	// (nil until a decision over it).
	index *rankIndex
}

func (s *shapeScores) get(n *NodeInventory, gen uint64, mix *allocate.SizeMix) *scoreEntry {
	s.mu.Lock()
	e := s.byNode[n.Node]
	s.mu.Unlock()
	if e == nil || e.node != n || e.gen != gen || (e.mixDependent && e.mix != mix) {
		return nil
	}
	return e
}

func (s *shapeScores) put(n *NodeInventory, e *scoreEntry) {
	s.mu.Lock()
	s.byNode[n.Node] = e
	s.mu.Unlock()
}

// prune drops, in every shape, the entries of nodes that are gone
// (Planner.Decide, over the whole inventory: a decision restricted to some
// nodes must not drop the others' scores).
func (c *scoreCache) prune(nodes []*NodeInventory) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.shapes.order.Front(); e != nil; e = e.Next() {
		e.Value.(*lruEntry[*shapeScores]).val.prune(nodes)
	}
}

// prune drops the entries of nodes that are gone, once they could make up
// half of the map.
func (s *shapeScores) prune(nodes []*NodeInventory) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byNode) <= 2*len(nodes)+64 {
		return
	}
	keep := make(map[string]*scoreEntry, len(nodes))
	for _, n := range nodes {
		if e, ok := s.byNode[n.Node]; ok {
			keep[n.Node] = e
		}
	}
	s.byNode = keep
}
