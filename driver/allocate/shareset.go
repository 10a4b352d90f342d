package allocate

import (
	"fmt"
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// maxShareSetCandidates bounds the sets ShareSet compares exactly; above
// it (more than 16 fitting GPUs and large counts) the shares go one by one.
const maxShareSetCandidates = 1 << 16

// ShareSet chooses count distinct GPUs of a node for count shares of one
// request (HAMi's nvidia.com/gpu: 2 with gpumem: the shares of one
// container are one job, talking over the links between their GPUs).
// Placed one by one, each share took the GPU best for it alone, and the
// set could end up joined by SYS while an NVLink pair was free. Here the
// set is chosen as for whole GPUs, weakest link first, then packed:
//
//  1. the strongest weakest link among the GPUs' pairs (and at least
//     req.RequiredLink);
//  2. with Binpack, most GPUs that already hold shares (no whole GPU is
//     given up for shares where a shared one fits); with Spread, fewest;
//  3. the largest link sum;
//  4. the lowest positions (deterministic).
//
// count 1 is placeShare's choice. The returned positions are ascending.
// Nil positions and a nil error mean the fitting GPUs are too many to
// compare every set: the caller places the shares one by one.
func ShareSet(n *NodeState, req Request, count int, pol Policy) ([]int, error) {
	if req.Share == nil || count < 1 {
		return nil, fmt.Errorf("ShareSet: a share request and a positive count are required, got share %v count %d", req.Share, count)
	}
	if count == 1 {
		r, err := allocateShare(n, req, pol)
		if err != nil {
			return nil, err
		}
		return r.GPUs, nil
	}
	elig := eligibleMask(n, req)
	var fit, shared uint64
	var counts [numMisfits]int
	for p := range n.Topology.Len() {
		why := notEligible
		if elig>>p&1 != 0 {
			why = n.shareFit(p, req.Share)
		}
		if why != fits {
			counts[why]++
			continue
		}
		fit |= 1 << p
		if n.usage(p).Shares > 0 {
			shared |= 1 << p
		}
	}
	if nfit := bits.OnesCount64(fit); nfit < count {
		return nil, &UnsatisfiableError{Node: n.Name, Reason: fmt.Sprintf("%d shares of %s memory and %d%% cores on distinct GPUs need %d GPUs that fit one, node %s has %d (%s)",
			count, formatBytes(req.Share.MemoryBytes), req.Share.Cores, count, n.Name, nfit, shareReason(n, req.Share, counts))}
	}
	if binomial(bits.OnesCount64(fit), count) > maxShareSetCandidates {
		return nil, nil
	}
	spread := pol.GPU.spread()
	var best []int
	var bestWeakest topology.Link
	var bestShared, bestSum int
	positions := make([]int, 0, count)
	var walk func(rest uint64)
	walk = func(rest uint64) {
		if len(positions) == count {
			weakest := n.Topology.WeakestLink(positions)
			if req.RequiredLink != topology.LinkNone && weakest < req.RequiredLink {
				return
			}
			onShared := 0
			for _, p := range positions {
				onShared += int(shared >> p & 1)
			}
			if spread {
				onShared = -onShared
			}
			sum := n.Topology.LinkSum(positions)
			better := best == nil || weakest > bestWeakest ||
				(weakest == bestWeakest && (onShared > bestShared || (onShared == bestShared && sum > bestSum)))
			if better {
				best = append(best[:0], positions...)
				bestWeakest, bestShared, bestSum = weakest, onShared, sum
			}
			return
		}
		for rest != 0 {
			p := bits.TrailingZeros64(rest)
			rest &^= 1 << p
			if bits.OnesCount64(rest) < count-len(positions)-1 {
				return
			}
			positions = append(positions, p)
			walk(rest)
			positions = positions[:len(positions)-1]
		}
	}
	walk(fit)
	if best == nil {
		return nil, &UnsatisfiableError{Node: n.Name, Reason: fmt.Sprintf("no %d GPUs of node %s that fit a share of %s memory and %d%% cores have every pair %s or better",
			count, n.Name, formatBytes(req.Share.MemoryBytes), req.Share.Cores, req.RequiredLink)}
	}
	return best, nil
}

// binomial is n choose k, saturating at maxShareSetCandidates+1.
func binomial(n, k int) int {
	if k < 0 || k > n {
		return 0
	}
	k = min(k, n-k)
	r := 1
	for i := 1; i <= k; i++ {
		r = r * (n - k + i) / i
		if r > maxShareSetCandidates {
			return maxShareSetCandidates + 1
		}
	}
	return r
}
