package allocate

import (
	"fmt"
	"math/bits"
	"strings"
)

// misfit is why a GPU cannot take a share; the counts explain failures.
type misfit int

const (
	fits misfit = iota
	notEligible
	exclusive
	memoryUnknown
	shareLimit
	otherGroup
	shortOfMemory
	shortOfCores
	numMisfits
)

var misfitWords = [numMisfits]string{
	notEligible:   "not eligible",
	exclusive:     "given out whole",
	memoryUnknown: "memory size unknown",
	shareLimit:    "at the share limit",
	otherGroup:    "holding shares of another sharing group",
	shortOfMemory: "short of memory",
	shortOfCores:  "short of cores",
}

// memoryLimit is what the shares of GPU p may add up to.
func (n *NodeState) memoryLimit(p int) int64 {
	total := n.Topology.GPUs[p].MemoryBytes
	if n.MemoryOvercommitPercent > 100 {
		return total / 100 * int64(n.MemoryOvercommitPercent)
	}
	return total
}

// maxShares is the node's cap on shares per GPU.
func (n *NodeState) maxShares() int {
	if n.MaxSharesPerGPU > 0 {
		return n.MaxSharesPerGPU
	}
	return DefaultMaxSharesPerGPU
}

func (n *NodeState) usage(p int) GPUUsage {
	if n.Usage == nil {
		return GPUUsage{}
	}
	return n.Usage[p]
}

// shareFit checks one GPU. A GPU whose memory size is unknown cannot take
// a share: its memory limit could not be enforced or accounted.
func (n *NodeState) shareFit(p int, s *ShareRequest) misfit {
	u := n.usage(p)
	total := n.Topology.GPUs[p].MemoryBytes
	switch {
	case u.Exclusive:
		return exclusive
	case total <= 0:
		return memoryUnknown
	case u.Shares >= n.maxShares():
		return shareLimit
	case u.Shares > 0 && u.Group != s.Group:
		return otherGroup
	case u.MemoryBytes > n.memoryLimit(p)-s.MemoryBytes:
		return shortOfMemory
	case u.Cores+s.Cores > maxShareCores:
		return shortOfCores
	}
	return fits
}

// loadPPM is a GPU's dominant load, the larger of its memory and core
// fractions, in parts per million, given extra consumption on top of usage
// that fits the GPU. The 128-bit product cannot overflow for any memory size.
func loadPPM(u GPUUsage, total int64, extra ShareRequest) int64 {
	hi, lo := bits.Mul64(uint64(u.MemoryBytes+extra.MemoryBytes), 1_000_000)
	mem, _ := bits.Div64(hi, lo, uint64(total))
	return max(int64(mem), (u.Cores+extra.Cores)*1_000_000/maxShareCores)
}

// sharePlacement is where a share would go and what ChooseNode scores.
type sharePlacement struct {
	pos int
	// fresh is true when the share would be the GPU's first, taking a
	// whole GPU out of the free pool.
	fresh bool
	// loadAfter is the GPU's dominant load with the share placed.
	loadAfter int64
	// freeAfter is the node's whole free GPUs with the share placed.
	freeAfter int
}

// placeShare chooses the GPU for a share; see doc.go. When nothing fits it
// returns the reason instead.
// picks, when not nil, remembers the fresh GPU chosen on nodes of the
// same state across the nodes of one ranking.
func placeShare(sc *scratch, n *NodeState, req Request, spread bool, mix *SizeMix, picks freshPicks) (sharePlacement, string) {
	s := req.Share
	elig := eligibleMask(n, req)
	free := freeMask(n)
	var counts [numMisfits]int
	var fresh uint64
	best := -1
	var bestLoad, bestRest int64
	for p := range n.Topology.Len() {
		why := notEligible
		if elig>>p&1 != 0 {
			why = n.shareFit(p, s)
		}
		if why != fits {
			counts[why]++
			continue
		}
		u := n.usage(p)
		if u.Shares == 0 {
			fresh |= 1 << p
			continue
		}
		total := n.Topology.GPUs[p].MemoryBytes
		var load, rest int64
		var better bool
		if spread {
			load = loadPPM(u, total, ShareRequest{})
			better = best < 0 || load < bestLoad
		} else {
			// Binpack is best fit: the GPU left fullest, then the one
			// with the least memory left over.
			load = loadPPM(u, total, *s)
			rest = total - u.MemoryBytes - s.MemoryBytes
			better = best < 0 || load > bestLoad || (load == bestLoad && rest < bestRest)
		}
		if better {
			best, bestLoad, bestRest = p, load, rest
		}
	}
	// A GPU that already holds shares is preferred over a fresh one when
	// packing (nothing whole is lost) and, when spreading, as long as it
	// is idle too (a fresh GPU has load 0, the minimum).
	useShared := best >= 0 && (!spread || fresh == 0 || bestLoad == 0)
	if !useShared && fresh != 0 {
		// Of the fresh GPUs, give up the one least useful for future
		// whole-GPU sets: the same choice as a one-GPU request.
		best = picks.pick(sc, n.Topology, free, fresh, mix)
	}
	if best < 0 {
		return sharePlacement{}, shareReason(n, s, counts)
	}
	u := n.usage(best)
	pl := sharePlacement{
		pos:       best,
		fresh:     u.Shares == 0,
		loadAfter: loadPPM(u, n.Topology.GPUs[best].MemoryBytes, *s),
		freeAfter: bits.OnesCount64(free),
	}
	if pl.fresh {
		pl.freeAfter--
	}
	return pl, ""
}

func allocateShare(n *NodeState, req Request, pol Policy) (Result, error) {
	sc := getScratch()
	pl, why := placeShare(sc, n, req, pol.GPU.spread(), pol.Mix, nil)
	putScratch(sc)
	if why != "" {
		return Result{}, &UnsatisfiableError{Node: n.Name, Reason: why}
	}
	return Result{Node: n.Name, GPUs: []int{pl.pos}}, nil
}

func shareReason(n *NodeState, s *ShareRequest, counts [numMisfits]int) string {
	var parts []string
	for why := misfit(1); why < numMisfits; why++ {
		if counts[why] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[why], misfitWords[why]))
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "none")
	}
	return fmt.Sprintf("no GPU on %s fits a share of %s memory and %d%% cores (%d GPUs: %s)",
		nodeLabel(n.Name), formatBytes(s.MemoryBytes), s.Cores, n.Topology.Len(), strings.Join(parts, ", "))
}

// formatBytes renders a size the way users write Kubernetes quantities.
func formatBytes(b int64) string {
	const ki = 1024
	for _, u := range []struct {
		unit string
		size int64
	}{{"Ti", ki * ki * ki * ki}, {"Gi", ki * ki * ki}, {"Mi", ki * ki}, {"Ki", ki}} {
		if b >= u.size && b%u.size == 0 {
			return fmt.Sprintf("%d%s", b/u.size, u.unit)
		}
		if b >= u.size {
			return fmt.Sprintf("%.1f%s", float64(b)/float64(u.size), u.unit)
		}
	}
	return fmt.Sprintf("%dB", b)
}
