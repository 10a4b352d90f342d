package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// freshPicks remembers, while one request is ranked over many nodes
// (chooseShare), which fresh GPU a share takes on a node of a topology
// with given free and fresh GPUs. That pick (the fresh GPU least useful to
// the whole-GPU sets of the mix) depends on nothing else, and ranking a
// share over FGD's 1,213-node trace repeated it for every node: half of a
// replay's time, with most nodes in the same few states. The mix is the
// ranking's, the same for every node, so it is not part of the key. A nil
// freshPicks remembers nothing.
type freshPicks map[freshPickKey]int

type freshPickKey struct {
	t           *topology.Topology
	free, fresh uint64
}

// pick is the fresh GPU a share takes among fresh (a subset of free) on
// topology t under mix.
func (fp freshPicks) pick(sc *scratch, t *topology.Topology, free, fresh uint64, mix *SizeMix) int {
	k := freshPickKey{t: t, free: free, fresh: fresh}
	if pos, ok := fp[k]; ok {
		return pos
	}
	pk := pickWhole(sc, t, free, fresh, 1, topology.LinkNone, true, mix)
	pos := bits.TrailingZeros64(pk.set)
	if fp != nil {
		fp[k] = pos
	}
	return pos
}
