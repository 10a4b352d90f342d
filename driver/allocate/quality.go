package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// key packs the quality of a GPU set so that one unsigned comparison
// orders sets of equal size: weakest link in the high bits, aggregate link
// (sum over pairs) in the low 16 bits. 64 GPUs have 2016 pairs of at most
// NV18 (24), so the aggregate never exceeds 48384 and cannot carry into
// the weakest link.
type key uint32

// noPairs is the weakest-link byte of a set with fewer than two GPUs. It is
// above every real link so that min() over pairs starts from it.
const noPairs = 0xFF

// singleKey is the quality of every one-GPU set.
const singleKey = key(noPairs << 16)

func makeKey(weak uint8, agg uint32) key { return key(uint32(weak)<<16 | agg) }

func (k key) weak() uint8 { return uint8(k >> 16) }

func (k key) agg() uint32 { return uint32(k) & 0xFFFF }

// link is the weakest link as Result reports it: LinkNone without pairs.
func (k key) link() topology.Link {
	if k.weak() == noPairs {
		return topology.LinkNone
	}
	return topology.Link(k.weak())
}

// qualifies reports whether a set of size size with this quality meets the
// required link. One GPU has no pairs, so it meets any requirement.
func (k key) qualifies(size int, required topology.Link) bool {
	return size < 2 || topology.Link(k.weak()) >= required
}

// setKey evaluates a set directly, for paths that are not hot.
func setKey(t *topology.Topology, set uint64) key {
	w, agg := uint8(noPairs), uint32(0)
	for a := set; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		for b := a & (a - 1); b != 0; b &= b - 1 {
			l := uint8(t.Link(i, bits.TrailingZeros64(b)))
			w = min(w, l)
			agg += uint32(l)
		}
	}
	return makeKey(w, agg)
}

// cut is the sum of links between set and rest. Among sets of equal
// quality, a smaller cut leaves the rest better connected: the aggregate
// of all free GPUs is agg(set) + agg(rest) + cut, so minimizing the cut
// maximizes agg(rest).
func cut(t *topology.Topology, set, rest uint64) uint32 {
	var sum uint32
	for a := set; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		for b := rest; b != 0; b &= b - 1 {
			sum += uint32(t.Link(i, bits.TrailingZeros64(b)))
		}
	}
	return sum
}

// lowerPositions reports whether a precedes b when both are read as
// ascending position lists: the lowest position in exactly one of them
// decides. This is the final, deterministic tie-break everywhere.
func lowerPositions(a, b uint64) bool {
	d := a ^ b
	return a&d&-d != 0
}

// positions lists the set bits of a mask in ascending order.
func positions(set uint64) []int {
	out := make([]int, 0, bits.OnesCount64(set))
	for ; set != 0; set &= set - 1 {
		out = append(out, bits.TrailingZeros64(set))
	}
	return out
}

// freeMask is the set of GPUs free to be given out whole: not exclusive
// and holding no shares.
func freeMask(n *NodeState) uint64 {
	all := fullMask(n.Topology.Len())
	var busy uint64
	for p, u := range n.Usage {
		if u.Exclusive || u.Shares > 0 {
			busy |= 1 << p
		}
	}
	return all &^ busy
}

// FreeGPUs counts the GPUs free to be given out whole: not exclusive and
// holding no shares.
func (n *NodeState) FreeGPUs() int { return bits.OnesCount64(freeMask(n)) }

// eligibleMask is the set of GPUs the request may use at all on n.
func eligibleMask(n *NodeState, req Request) uint64 {
	eligible := req.Eligible
	if req.EligibleByNode != nil {
		eligible = req.EligibleByNode[n.Name]
		if eligible == nil {
			return 0
		}
	}
	if eligible == nil {
		return fullMask(n.Topology.Len())
	}
	var m uint64
	for p, ok := range eligible {
		if ok {
			m |= 1 << p
		}
	}
	return m
}

func fullMask(n int) uint64 {
	if n >= 64 {
		return ^uint64(0)
	}
	return 1<<n - 1
}
