package allocate

import "runtime"

// table holds the quality of every subset of the free GPUs, indexed by
// local mask. A fixed-size array lets masks index it without bounds checks.
// A search uses only entries it wrote itself, so a reused table needs no
// clearing.
type table [1 << exactMaxFree]key

// scratch holds the buffers one search needs, reused (see scratchFree) so
// searches do not allocate.
type scratch struct {
	q    *table
	ties []uint32 // local masks of the equally best sets
	tied []tied
	fut  [2]futureScore
	loc  local
	// kindLoc is the node's whole topology, to find its kind.
	kindLoc local
	// Beam search buffers.
	cur, next, kept []beamState
	heap            beamHeap
	chosen          []bool
	seen            setTable
	// strands remembers stranding across the nodes of one ranking.
	strands strandCache
}

// scratchFree keeps idle scratch buffers. Unlike a sync.Pool it is not
// emptied by garbage collection, which would make every search after a GC
// allocate a fresh 256 KiB table. It holds two per CPU, at most 64 (about
// 17 MiB); more concurrent searches allocate and drop their own.
var scratchFree = make(chan *scratch, min(64, 2*runtime.GOMAXPROCS(0)))

func getScratch() *scratch {
	select {
	case s := <-scratchFree:
		return s
	default:
		return new(scratch)
	}
}

func putScratch(s *scratch) {
	select {
	case scratchFree <- s:
	default:
	}
}
