package allocate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpulink/gpulink/driver/topology"
)

// Defaults of the recent size mix a controller keeps (SizeHistory).
const (
	// DefaultHistoryWindow is how many recent requests the mix counts:
	// enough that one odd job barely moves it, few enough that a change
	// of workload shows within minutes on a busy cluster.
	DefaultHistoryWindow = 512
	// DefaultHistoryRefresh is how many requests pass between two
	// snapshots of the mix. Searches on 12 or more free GPUs are memoized
	// by mix (memo.go), so a mix that changed on every request would make
	// every such decision cold.
	DefaultHistoryRefresh = 64
	// DefaultDemandRefresh is how many pods pass between two snapshots of
	// the demand mix of ranking by stranding (DemandHistory) in the
	// controller, and in the replay that models it: every new mix makes
	// every kept node score stale (a rescore of the cluster, about 100 ms
	// at 5,000 nodes), so it is refreshed less often than the size mix.
	DefaultDemandRefresh = DefaultHistoryWindow / 2
	// historyPrior is the pseudo-count every size 1..8 gets on top of the
	// window's counts, so a size nobody asked for lately keeps a small
	// weight instead of none: the fragmentation criterion still keeps one
	// such set when it costs nothing else.
	historyPrior = 1
	// historyPriorMax is the largest size the prior covers: what one node
	// of up to 8 GPUs can hold (as DefaultSizeMix).
	historyPriorMax = 8
)

// SizeHistory is a bounded, decaying record of the request sizes (whole
// GPUs) a controller was asked for: the counts over the last Window
// requests, plus a pseudo-count of one for each size 1..8. Its Mix is a
// snapshot of those counts taken every Refresh requests. It is a pure
// function of the sequence of recorded sizes, so a decision that uses it
// is deterministic for a given sequence of requests and cluster state, and
// `gpulink simulate` replays it from the counts (Counts, as a scenario's
// sizeMix) or from the same sequence (a scenario's recentMix). A
// SizeHistory is not safe for concurrent use.
type SizeHistory struct {
	window, refresh int
	ring            []uint8 // sizes, oldest overwritten first
	next            int     // where the next size goes in ring
	counts          [topology.MaxGPUs + 1]int
	since           int // sizes recorded since the last snapshot
	total           int // sizes recorded ever
	mix             *SizeMix
	snapshot        [topology.MaxGPUs + 1]int // counts behind mix
}

// NewSizeHistory keeps the last window request sizes and takes a new
// snapshot of the mix every refresh of them (1 <= refresh <= window).
func NewSizeHistory(window, refresh int) (*SizeHistory, error) {
	if window < 1 {
		return nil, fmt.Errorf("size history: window must be at least 1, got %d", window)
	}
	if refresh < 1 || refresh > window {
		return nil, fmt.Errorf("size history: refresh must be 1..window (%d), got %d", window, refresh)
	}
	h := &SizeHistory{window: window, refresh: refresh, ring: make([]uint8, 0, window)}
	h.mix = h.build()
	return h, nil
}

// Record adds one request of size whole GPUs; sizes outside
// 1..topology.MaxGPUs are ignored (they cannot be valid requests).
func (h *SizeHistory) Record(size int) {
	if size < 1 || size > topology.MaxGPUs {
		return
	}
	if len(h.ring) < h.window {
		h.ring = append(h.ring, uint8(size))
	} else {
		h.counts[h.ring[h.next]]--
		h.ring[h.next] = uint8(size)
		h.next = (h.next + 1) % h.window
	}
	h.counts[size]++
	h.total++
	h.since++
	if h.since >= h.refresh {
		h.since = 0
		h.mix = h.build()
	}
}

// Mix is the snapshot the allocator should use now (Policy.Mix).
func (h *SizeHistory) Mix() *SizeMix { return h.mix }

// Recorded is how many sizes were ever recorded.
func (h *SizeHistory) Recorded() int { return h.total }

// Counts are the weights behind Mix: the window's counts at the last
// snapshot plus the prior, by size. Given as a scenario's sizeMix, they
// make `gpulink simulate` use exactly this mix.
func (h *SizeHistory) Counts() map[int]int {
	out := map[int]int{}
	for s, n := range h.snapshot {
		if n > 0 {
			out[s] = n
		}
	}
	return out
}

// String lists Counts as "size:count", ascending by size, the form the
// controller logs with each decision.
func (h *SizeHistory) String() string {
	c := h.Counts()
	sizes := slices.Sorted(func(yield func(int) bool) {
		for s := range c {
			if !yield(s) {
				return
			}
		}
	})
	parts := make([]string, 0, len(sizes))
	for _, s := range sizes {
		parts = append(parts, fmt.Sprintf("%d:%d", s, c[s]))
	}
	return strings.Join(parts, " ")
}

func (h *SizeHistory) build() *SizeMix {
	h.snapshot = h.counts
	for s := 1; s <= historyPriorMax; s++ {
		h.snapshot[s] += historyPrior
	}
	freq := map[int]float64{}
	for s, n := range h.snapshot {
		if n > 0 {
			freq[s] = float64(n)
		}
	}
	// Cannot fail: sizes are 1..MaxGPUs and the prior makes the total
	// positive.
	return mustSizeMix(freq)
}
