package planner

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpulink/gpulink/driver/allocate"
)

// rankIndex keeps one request shape's node scores over the inventory's
// whole node list, ranked, between decisions: a decision rescores only
// the nodes whose usage generation moved since the shape's last decision
// (usageSource.Changes), moves them in the ranking, and reads the
// best-ranked nodes off it, instead of reading every node's generation and
// kept score and ranking them all again (which cost a 5,000-node decision
// 2-4 ms of CPU with nothing to rescore). A new size mix rescores the
// nodes whose score depended on it, as the kept scores of
// shapeScores.entry would; a new demand mix ranks every node anew, the
// ones that did not change from their kept stranding basis
// (rankIndex.restrand), without scoring them again.
//
// The ranking is a binary heap of the positions of the nodes the shape
// fits, ordered as rankHeap orders them (allocate.NodeScore.Better, names
// breaking ties: a total order), and read best first without changing it
// (rankIndex.walk), so that the nodes taken by a decision's choice and
// alternatives are the ones popping a heap of every fitting node gives.
type rankIndex struct {
	// nodes is the list the index is over (Inventory.All's: a copy per
	// call, compared by its nodes, which are replaced when they change);
	// pools finds a pool's positions in it.
	nodes     []*NodeInventory
	pools     map[string][]int32
	positions *poolPositions
	// entries are the nodes' scores by position, valid for the usage
	// changes up to seq, the size mix mix and the demand mix demand.
	entries []*scoreEntry
	seq     uint64
	mix     *allocate.SizeMix
	demand  *allocate.DemandMix
	// heap holds the positions of the entries that fit, best first;
	// where is each position's index in it (-1: not in it).
	heap  []int32
	where []int32
	pol   allocate.Policy
	// mixDependent are the positions whose score depends on the size mix.
	mixDependent map[int32]struct{}
	// nonUniform counts the entries whose devices take several share
	// sizes; shareKeys counts the entries of each share size.
	nonUniform int
	shareKeys  map[string]int
	// scratch, reused between decisions.
	changed []string
	marked  []int32
	mark    []bool
	gens    []uint64
	stale   []*NodeInventory
}

// indexSyncs counts how rankIndex.sync went: incremental (only what
// changed rescored; restranded: the others ranked under a new demand mix
// from their basis) or built anew, because the node list changed (a
// shape's first decision included), the usage log no longer held the
// changes since its last, or ranking by stranding started or stopped.
var indexSyncs struct {
	incremental, restranded, builtNodes, builtLog, builtDemand atomic.Int64
}

// RankingCounts are the process's counts of ranking work since it
// started (the controller's metrics export them): node scores computed
// afresh, the shapes' ranked indexes synced incrementally (of which
// Restranded under a new demand mix) and built anew by reason ("nodes",
// "log", "demand").
type RankingCounts struct {
	NodesScored, IncrementalSyncs, Restranded int64
	Builds                                    map[string]int64
}

// Ranking returns the counts so far.
func Ranking() RankingCounts {
	return RankingCounts{NodesScored: nodesScored.Load(), IncrementalSyncs: indexSyncs.incremental.Load(), Restranded: indexSyncs.restranded.Load(), Builds: map[string]int64{
		"nodes": indexSyncs.builtNodes.Load(), "log": indexSyncs.builtLog.Load(), "demand": indexSyncs.builtDemand.Load()}}
}

// built is the count of builds for any reason.
func (c RankingCounts) built() int64 { return c.Builds["nodes"] + c.Builds["log"] + c.Builds["demand"] }

// scoreInput is what scoring a node for the shape needs besides the node.
type scoreInput struct {
	sel   *SelectorEvaluator
	pol   allocate.Policy
	usage usageSource
	alt   *Alternative
	sig   string
	rank  *hostRanking
}

// sync brings the index up to date for nodes (the inventory's list) and
// the policy's mixes, rescoring what changed. kept gives the entries
// shapeScores keeps, to take over when the index is built anew.
func (ix *rankIndex) sync(ctx context.Context, in scoreInput, nodes []*NodeInventory, kept *shapeScores) {
	if !sameNodes(ix.nodes, nodes) {
		indexSyncs.builtNodes.Add(1)
		ix.build(ctx, in, nodes, kept)
		return
	}
	changed, now, ok := in.usage.Changes(ix.seq, ix.changed[:0])
	ix.changed = changed[:0]
	switch {
	case !ok:
		indexSyncs.builtLog.Add(1)
		ix.build(ctx, in, nodes, kept)
		return
	case in.pol.Demand != ix.demand && (in.pol.Demand == nil || ix.demand == nil):
		// Ranking by stranding started (the first demand mix) or
		// stopped: every score ranks against the others only under one.
		indexSyncs.builtDemand.Add(1)
		ix.build(ctx, in, nodes, kept)
		return
	}
	indexSyncs.incremental.Add(1)
	ix.marked = ix.marked[:0]
	markPos := func(p int32) {
		if !ix.mark[p] {
			ix.mark[p] = true
			ix.marked = append(ix.marked, p)
		}
	}
	for _, pool := range changed {
		for _, p := range ix.pools[pool] {
			markPos(p)
		}
	}
	if in.pol.Mix != ix.mix {
		for p := range ix.mixDependent {
			markPos(p)
		}
	}
	if in.pol.Demand != ix.demand {
		// A new demand mix: the nodes that did not change are ranked
		// under it from their kept stranding basis, not scored again.
		indexSyncs.restranded.Add(1)
		for _, p := range ix.restrand(in.pol.Demand, kept) {
			markPos(p)
		}
		ix.demand = in.pol.Demand
	}
	ix.seq, ix.mix = now, in.pol.Mix
	if len(ix.marked) == 0 {
		return
	}
	ix.stale = ix.stale[:0]
	for _, p := range ix.marked {
		ix.mark[p] = false
		ix.stale = append(ix.stale, nodes[p])
	}
	ix.gens = growTo(ix.gens, len(ix.stale))
	in.usage.Generations(ix.stale, ix.gens)
	for i, p := range ix.marked {
		ix.set(p, ix.score(ctx, in, nodes[p], ix.gens[i], kept))
	}
	clear(ix.stale)
}

// build scores every node afresh, or takes the score kept for it when
// still valid, and ranks them.
func (ix *rankIndex) build(ctx context.Context, in scoreInput, nodes []*NodeInventory, kept *shapeScores) {
	if !sameNodes(ix.nodes, nodes) {
		ix.nodes = nodes
		ix.pools = ix.positions.of(nodes)
		ix.mark = make([]bool, len(nodes))
	}
	ix.gens = growTo(ix.gens, len(nodes))
	ix.seq = in.usage.Generations(nodes, ix.gens)
	ix.mix, ix.demand, ix.pol = in.pol.Mix, in.pol.Demand, in.pol
	ix.entries = make([]*scoreEntry, len(nodes))
	ix.where = make([]int32, len(nodes))
	ix.heap = ix.heap[:0]
	ix.mixDependent = map[int32]struct{}{}
	ix.nonUniform, ix.shareKeys = 0, map[string]int{}
	for i, n := range nodes {
		ix.where[i] = -1
		e := kept.get(n, ix.gens[i], in.pol.Mix)
		if e == nil || e.demand != in.pol.Demand {
			e = ix.score(ctx, in, n, ix.gens[i], kept)
		}
		ix.set(int32(i), e)
	}
}

// restrand ranks the entries not marked for rescoring under the demand
// mix d (the index's is another, neither nil): an entry's score depends
// on the demand mix only through the GPU its placement strands, which its
// basis gives under d exactly as scoring the node again would
// (allocate.NodeScore.WithStranded). It returns the positions it could
// not restrand (none expected: a fitting entry computed with a demand mix
// has a basis), for the caller to score again.
func (ix *rankIndex) restrand(d *allocate.DemandMix, kept *shapeScores) (rescore []int32) {
	for p, e := range ix.entries {
		if ix.mark[p] {
			continue
		}
		ne := *e
		ne.demand = d
		if e.fits && !e.skip && !e.nonUniform {
			if e.basis == nil {
				rescore = append(rescore, int32(p))
				continue
			}
			ne.score = e.score.WithStranded(d, e.basis)
		}
		ix.entries[p] = &ne
		kept.put(ne.node, &ne)
	}
	// Every fitting node's score moved: order the ranking again.
	for i := len(ix.heap)/2 - 1; i >= 0; i-- {
		ix.down(i)
	}
	return rescore
}

// score computes a node's entry and keeps it in shapeScores too.
func (ix *rankIndex) score(ctx context.Context, in scoreInput, n *NodeInventory, gen uint64, kept *shapeScores) *scoreEntry {
	e := scoreNode(ctx, in.sel, in.pol, n, in.usage, in.alt, in.sig, gen, in.rank, in.rank.nodeHost(n.Node))
	kept.put(n, e)
	nodesScored.Add(1)
	return e
}

// set makes e position p's entry, in the counts and the ranking.
func (ix *rankIndex) set(p int32, e *scoreEntry) {
	if old := ix.entries[p]; old != nil {
		ix.count(old, -1)
	}
	ix.entries[p] = e
	ix.count(e, 1)
	if e.mixDependent {
		ix.mixDependent[p] = struct{}{}
	} else {
		delete(ix.mixDependent, p)
	}
	in, at := e.fits && !e.skip && !e.nonUniform, ix.where[p]
	switch {
	case in && at < 0:
		ix.where[p] = int32(len(ix.heap))
		ix.heap = append(ix.heap, p)
		ix.up(len(ix.heap) - 1)
	case in:
		if !ix.down(int(at)) {
			ix.up(int(at))
		}
	case at >= 0:
		last := len(ix.heap) - 1
		ix.swap(int(at), last)
		ix.heap = ix.heap[:last]
		ix.where[p] = -1
		if int(at) < last && !ix.down(int(at)) {
			ix.up(int(at))
		}
	}
}

// count adds sign times e to the counts that make a decision unsure.
func (ix *rankIndex) count(e *scoreEntry, sign int) {
	switch {
	case e.skip:
	case e.nonUniform:
		ix.nonUniform += sign
	case e.shareKey != "":
		if ix.shareKeys[e.shareKey] += sign; ix.shareKeys[e.shareKey] == 0 {
			delete(ix.shareKeys, e.shareKey)
		}
	}
}

// unsure tells whether quickChoice cannot vouch for a choice: some node's
// devices take several share sizes, or nodes disagree on the share size.
func (ix *rankIndex) unsure() bool {
	return ix.nonUniform > 0 || len(ix.shareKeys) > 1
}

// less tells whether heap entry i ranks before heap entry j.
func (ix *rankIndex) less(i, j int) bool {
	a, b := ix.entries[ix.heap[i]], ix.entries[ix.heap[j]]
	return a.score.Better(b.score, a.node.tie(), b.node.tie(), ix.pol)
}

func (ix *rankIndex) swap(i, j int) {
	ix.heap[i], ix.heap[j] = ix.heap[j], ix.heap[i]
	ix.where[ix.heap[i]] = int32(i)
	ix.where[ix.heap[j]] = int32(j)
}

func (ix *rankIndex) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !ix.less(j, i) {
			break
		}
		ix.swap(i, j)
		j = i
	}
}

// down moves heap entry i down to its place; it tells whether it moved.
func (ix *rankIndex) down(i int) bool {
	start, n := i, len(ix.heap)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && ix.less(r, c) {
			c = r
		}
		if !ix.less(c, i) {
			break
		}
		ix.swap(i, c)
		i = c
	}
	return i > start
}

// walk returns the fitting nodes best first, without changing the index:
// a frontier of heap entries (the best is always the root or a child of
// one already returned), itself a heap. It is valid until the index's
// next sync.
func (ix *rankIndex) walk() *rankWalk {
	w := &rankWalk{ix: ix}
	if len(ix.heap) > 0 {
		w.front = append(w.front, 0)
	}
	return w
}

// rankWalk reads a rankIndex best first.
type rankWalk struct {
	ix    *rankIndex
	front []int32
	taken int
}

func (w *rankWalk) Len() int { return len(w.ix.heap) - w.taken }

// next returns the next node in rank order.
func (w *rankWalk) next() *NodeInventory {
	best := w.front[0]
	last := len(w.front) - 1
	w.front[0] = w.front[last]
	w.front = w.front[:last]
	w.frontDown(0)
	for _, c := range [2]int32{2*best + 1, 2*best + 2} {
		if int(c) < len(w.ix.heap) {
			w.front = append(w.front, c)
			w.frontUp(len(w.front) - 1)
		}
	}
	w.taken++
	return w.ix.entries[w.ix.heap[best]].node
}

func (w *rankWalk) frontUp(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !w.ix.less(int(w.front[j]), int(w.front[i])) {
			break
		}
		w.front[i], w.front[j] = w.front[j], w.front[i]
		j = i
	}
}

func (w *rankWalk) frontDown(i int) {
	n := len(w.front)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && w.ix.less(int(w.front[r]), int(w.front[c])) {
			c = r
		}
		if !w.ix.less(int(w.front[c]), int(w.front[i])) {
			return
		}
		w.front[i], w.front[c] = w.front[c], w.front[i]
		i = c
	}
}

// sameNodes tells whether a and b list the same nodes in the same order:
// the same slice (the inventory's own, Inventory.sortedNodes) or a copy.
func sameNodes(a, b []*NodeInventory) bool {
	return sameList(a, b) || slices.Equal(a, b)
}

// sameList tells whether a and b are the same slice.
func sameList(a, b []*NodeInventory) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// growTo returns s with length n, reusing its array when large enough.
func growTo[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// poolPositions finds each pool's positions in the inventory's list, for
// every shape's index (one map of every pool, not one per shape).
type poolPositions struct {
	mu    sync.Mutex
	nodes []*NodeInventory
	pools map[string][]int32
}

// of returns the positions of each pool in nodes; read-only.
func (pp *poolPositions) of(nodes []*NodeInventory) map[string][]int32 {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.pools == nil || !sameNodes(pp.nodes, nodes) {
		pp.nodes = nodes
		pp.pools = make(map[string][]int32, len(nodes))
		for i, n := range nodes {
			pp.pools[n.Pool] = append(pp.pools[n.Pool], int32(i))
		}
	}
	return pp.pools
}
