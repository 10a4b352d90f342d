package allocate

import (
	"hash/maphash"

	"github.com/gpulink/gpulink/driver/topology"
)

// strandCache remembers, while one request is ranked over many nodes
// (chooseShare, chooseWhole), the GPU its placement strands on a node
// (strandDelta) by everything that decides it: the node's topology (its
// product and each GPU's memory), what each GPU has left, the host's CPU
// and memory left, and the GPUs taken. The request and the mix are the
// ranking's, the same for every node (begin starts a ranking). The nodes of
// a cluster are mostly in a few states (idle, or holding the same pods):
// on FGD's trace, with the fresh GPU remembered (freshPicks), this pass was
// four fifths of a gpulink replay, and chooseWhole also asked it twice of
// a node (its bound, then its score).
//
// It is direct-mapped and lives in the scratch, so it allocates nothing
// and stays small: a map holding every node's state made a ranking over
// 1,000 nodes that never repeat (BenchmarkChooseNodeStranding, every
// node's host its own) half as slow again, its quarter megabyte pushing
// the mix's shapes out of the caches that the pass over them relies on. A
// state whose slot another took is measured again.
type strandCache struct {
	seed  maphash.Seed
	gen   uint32 // the ranking's; slots of another are empty
	slots [strandCacheSlots]strandSlot
}

// strandCacheSlots is a power of two: a hash picks a slot by its low bits.
const strandCacheSlots = 512

type strandSlot struct {
	gen uint32
	key strandKey
	d   int64
}

type strandKey struct {
	t         *topology.Topology
	left      [strandMemoMaxGPUs]int32
	hostKnown bool
	host      Host
	set       uint64
}

// strandMemoMaxGPUs bounds the nodes remembered, to keep a key small.
// Larger nodes are measured every time.
const strandMemoMaxGPUs = 16

// begin starts a ranking: what was remembered for another request or mix
// is forgotten.
func (c *strandCache) begin() {
	if c.gen == 0 && c.seed == (maphash.Seed{}) {
		c.seed = maphash.MakeSeed()
	}
	c.gen++
	if c.gen == 0 {
		// Wrapped: a slot of the ranking 2^32 ago must not pass for this
		// one's.
		clear(c.slots[:])
		c.gen = 1
	}
}

// delta is strandDelta(m, n, req, set), remembered. A nil cache remembers
// nothing.
func (c *strandCache) delta(m *DemandMix, n *NodeState, req Request, set uint64) int64 {
	if c == nil || n.Topology.Len() > strandMemoMaxGPUs {
		return strandDelta(m, n, req, set)
	}
	k := strandKey{t: n.Topology, set: set}
	gpuLeft(n, k.left[:0])
	if n.Host != nil {
		k.hostKnown, k.host = true, *n.Host
	}
	s := &c.slots[maphash.Comparable(c.seed, k)&(strandCacheSlots-1)]
	if s.gen == c.gen && s.key == k {
		return s.d
	}
	d := strandDelta(m, n, req, set)
	s.gen, s.key, s.d = c.gen, k, d
	return d
}
