package allocate

import (
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// The allocation policies of MAPA (Ranganath et al., "MAPA: Multi-
// Accelerator Pattern Allocation Policy for Multi-Tenant GPU Servers",
// SC '21), written here from the paper's description as churn baselines.
// MAPA matches a job's communication pattern (a graph) onto the free
// accelerators of the server's topology graph and scores each match by
// the bandwidth of the links it uses. Jobs in this harness say nothing of
// their pattern, so every multi-GPU job is taken as all-to-all (every pair
// of its GPUs communicates, as collectives and NCCL's tree and ring
// algorithms do over a set): a match is a k-subset of the free GPUs.
//
//   - baseline: the GPUs in the order of their IDs (firstFit), what a
//     topology-blind scheduler does;
//   - topology-aware: the prior work MAPA compares with, which places a job
//     on the GPUs closest to each other in the machine's hierarchy: the
//     set with the least total distance over its pairs, a link class being
//     a number of hops (mapaHops);
//   - greedy: the match with the highest bandwidth for the job itself
//     (the sum of its pairs' bandwidth, mapaBandwidth), regardless of
//     what it leaves;
//   - preserve: the match that leaves the most bandwidth among the GPUs
//     still free (the sum over their pairs), keeping well-connected GPUs
//     for the jobs to come; the job's own bandwidth breaks ties.
//
// Every policy breaks its remaining ties by lowest positions. The paper's
// hardware model weights links by measured bandwidth; mapaBandwidth uses
// nominal figures per link class instead, the same for every fixture.

// mapaBandwidth is the nominal one-direction bandwidth of a link class in
// GB/s: 25 per NVLink lane, then PCIe Gen3 x16 through a switch, down to
// crossing the SMP interconnect.
func mapaBandwidth(l topology.Link) int {
	switch {
	case l.IsNVLink():
		return 25 * l.Lanes()
	case l == topology.LinkPIX:
		return 12
	case l == topology.LinkPXB:
		return 10
	case l == topology.LinkPHB:
		return 8
	case l == topology.LinkNODE:
		return 7
	}
	return 5
}

// mapaHops is the distance of a link class in the hierarchy topology-aware
// placement minimizes: one hop over NVLink or within a PCIe switch, more
// for every level the path climbs.
func mapaHops(l topology.Link) int {
	switch {
	case l.IsNVLink(), l == topology.LinkPIX:
		return 1
	case l == topology.LinkPXB:
		return 2
	case l == topology.LinkPHB:
		return 3
	case l == topology.LinkNODE:
		return 4
	}
	return 5
}

// mapaMaxFree bounds the free GPUs the MAPA policies enumerate the sets
// of (they have no search of their own beyond trying every match).
const mapaMaxFree = 16

// mapaPick enumerates the k-subsets of the free GPUs and returns the one
// with the highest score (ties: the first in lowest-position order). nil
// when the node has more than mapaMaxFree free GPUs.
func mapaPick(n *NodeState, k int, score func(t *topology.Topology, set, rest uint64) [2]int) []int {
	free := freeMask(n)
	f := bits.OnesCount64(free)
	if f < k || f > mapaMaxFree {
		return nil
	}
	pos := positions(free)
	var best uint64
	var bestScore [2]int
	found := false
	// Gosper's hack over local masks, in increasing numeric order; a
	// later set wins only when strictly better, and among equal scores
	// the lowest-position set is kept by comparing explicitly.
	for m := uint32(1)<<k - 1; m < 1<<f; {
		var set uint64
		for x := m; x != 0; x &= x - 1 {
			set |= 1 << pos[bits.TrailingZeros32(x)]
		}
		s := score(n.Topology, set, free&^set)
		if !found || s[0] > bestScore[0] || (s[0] == bestScore[0] && (s[1] > bestScore[1] ||
			(s[1] == bestScore[1] && lowerPositions(set, best)))) {
			best, bestScore, found = set, s, true
		}
		c := m & -m
		r := m + c
		m = (((r ^ m) >> 2) / c) | r
	}
	return positions(best)
}

// pairSum adds f(link) over the pairs of set.
func pairSum(t *topology.Topology, set uint64, f func(topology.Link) int) int {
	sum := 0
	for a := set; a != 0; a &= a - 1 {
		i := bits.TrailingZeros64(a)
		for b := a & (a - 1); b != 0; b &= b - 1 {
			sum += f(t.Link(i, bits.TrailingZeros64(b)))
		}
	}
	return sum
}

func mapaTopoAware(n *NodeState, k int) []int {
	return mapaPick(n, k, func(t *topology.Topology, set, _ uint64) [2]int {
		return [2]int{-pairSum(t, set, mapaHops), 0}
	})
}

func mapaGreedy(n *NodeState, k int) []int {
	return mapaPick(n, k, func(t *topology.Topology, set, _ uint64) [2]int {
		return [2]int{pairSum(t, set, mapaBandwidth), 0}
	})
}

func mapaPreserve(n *NodeState, k int) []int {
	return mapaPick(n, k, func(t *topology.Topology, set, rest uint64) [2]int {
		return [2]int{pairSum(t, rest, mapaBandwidth), pairSum(t, set, mapaBandwidth)}
	})
}
