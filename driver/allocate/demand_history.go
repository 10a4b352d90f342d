package allocate

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// DemandHistory is the recent GPU pods a controller was asked to place,
// as DemandShapes: the counts over the last window pods, plus a
// pseudo-count of one for every shape ever recorded (up to
// maxSeenShapes of them), snapshot into a DemandMix every refresh pods.
// The pseudo-count is for the rare, large pods: a pod that takes a whole
// node of the only kind big enough for it comes a few times in
// thousands, so a window of recent pods mostly misses it, and without
// weight nothing would keep such a node whole for it (as SizeHistory's
// prior keeps every size 1..8 a weight). Like SizeHistory it is a pure
// function of what it was told, in order. Not safe for concurrent use.
//
// A controller started on an empty cluster knows nothing of its pods,
// and what it places first stays placed: on FGD's trace with GPU-model
// constraints such a controller, ranking with a mix of its first pod
// until its 256th, let the pods that may run anywhere take the nodes of
// the models that pinned pods need, and left more GPU unallocated at
// 70 % arrived than first fit (docs/performance/trace.md, "A controller
// started on an empty cluster"). Two things stand in for the pods not
// seen yet:
//
//   - the mix is snapshot more often while it is young: after every
//     recordedPerSnapshot-th part of the pods recorded so far (after each
//     of the first 16 pods, then every 2nd, and so on), until that is
//     refresh pods;
//   - every GPU product the cluster has (AssumeProducts) counts as a
//     shape of one GPU pinned to it, with the pseudo-count of a seen
//     shape, until assumedUntil pods were recorded: until pods say which
//     products are asked for by name, each product's GPU is kept for pods
//     that may name it, and the pods that may run anywhere go where the
//     GPU is most plentiful (WithScarcity). Such a shape asks for the
//     median CPU and memory per GPU of the shapes recorded and known (none
//     before the first): one asking for none would count every GPU whose
//     node's CPU is gone as usable, and hide what the pods' own shapes say
//     is stranded.
type DemandHistory struct {
	window, refresh int
	ring            []DemandShape
	next            int
	counts          map[DemandShape]int
	seen            map[DemandShape]bool
	// assumed are AssumeProducts' products, sorted; counted while
	// recorded < assumedUntil.
	assumed  []string
	since    int
	recorded int
	mix      *DemandMix
}

// maxSeenShapes bounds the shapes DemandHistory gives a pseudo-count:
// shapes first recorded after that many others get none.
const maxSeenShapes = 4 * maxDemandShapes

const (
	// recordedPerSnapshot: while young, the mix is snapshot again once
	// this fraction (1/recordedPerSnapshot) of the pods recorded so far
	// were recorded since the last snapshot. Each snapshot makes the
	// controller rescore every node once (stranding.go's demandRefresh),
	// so the young mix costs about recordedPerSnapshot × ln(refresh ×
	// recordedPerSnapshot) of them (about 55 with the defaults, against 8
	// at a fixed refresh over the same 2,048 pods).
	recordedPerSnapshot = 8
	// assumedUntil is how many recorded pods the assumed products count
	// for: by then the window's own pods, with the shapes seen, say what
	// is asked for, and an assumption that no pod confirmed would keep
	// steering pods off the rare products for nothing (on FGD's lists
	// without constraints, counted for good, it left up to 0.9 point of
	// the GPU more unallocated; for the first 256 pods, 0.06 or less).
	assumedUntil = DefaultDemandRefresh
)

// NewDemandHistory keeps the last window shapes and rebuilds the mix
// every refresh of them (1 <= refresh <= window).
func NewDemandHistory(window, refresh int) (*DemandHistory, error) {
	if window < 1 {
		return nil, fmt.Errorf("demand history: window must be at least 1, got %d", window)
	}
	if refresh < 1 || refresh > window {
		return nil, fmt.Errorf("demand history: refresh must be 1..window (%d), got %d", window, refresh)
	}
	return &DemandHistory{window: window, refresh: refresh, counts: map[DemandShape]int{}, seen: map[DemandShape]bool{}}, nil
}

// Record adds one pod's shape; an invalid shape is an error and is not
// recorded.
func (h *DemandHistory) Record(s DemandShape) error {
	if err := s.validate(); err != nil {
		return err
	}
	if len(h.ring) < h.window {
		h.ring = append(h.ring, s)
	} else {
		old := h.ring[h.next]
		if h.counts[old]--; h.counts[old] == 0 {
			delete(h.counts, old)
		}
		h.ring[h.next] = s
		h.next = (h.next + 1) % h.window
	}
	h.counts[s]++
	if len(h.seen) < maxSeenShapes {
		h.seen[s] = true
	}
	h.since++
	h.recorded++
	endsAssumption := h.recorded == assumedUntil && len(h.assumed) > 0
	if h.mix == nil || h.since >= h.interval() || endsAssumption {
		h.since = 0
		return h.snapshot()
	}
	return nil
}

// interval is how many recorded pods pass between two snapshots now.
func (h *DemandHistory) interval() int {
	return min(h.refresh, max(1, h.recorded/recordedPerSnapshot))
}

// Know gives a shape the pseudo-count of a recorded one without counting
// it as a recent pod: for what the operator (or the pods already running
// when the controller starts) says will be asked for before it is. The
// mix is rebuilt at once (Know is for start-up, not for every pod). An
// invalid shape is an error.
func (h *DemandHistory) Know(s DemandShape) error {
	if err := s.validate(); err != nil {
		return err
	}
	if len(h.seen) < maxSeenShapes {
		h.seen[s] = true
	}
	return h.snapshot()
}

// Assuming tells whether AssumeProducts still counts: fewer than
// assumedUntil pods were recorded.
func (h *DemandHistory) Assuming() bool { return h.recorded < assumedUntil }

// AssumeProducts sets the GPU products the cluster has, each counted as a
// shape of one GPU pinned to it until pods say what is asked for (the
// type's comment); the mix is rebuilt when they changed. Products named
// "" are skipped (a node whose GPUs name none is not one of a product);
// a product name with "|" is an error (it could not be told from two).
// Once Assuming is false it does nothing.
func (h *DemandHistory) AssumeProducts(products []string) error {
	if !h.Assuming() {
		return nil
	}
	named := make([]string, 0, len(products))
	for _, p := range products {
		if p == "" {
			continue
		}
		if strings.Contains(p, "|") {
			return fmt.Errorf("demand history: product %q: a product name must not contain %q", p, "|")
		}
		named = append(named, p)
	}
	slices.Sort(named)
	named = slices.Compact(named)
	if slices.Equal(named, h.assumed) {
		return nil
	}
	h.assumed = named
	return h.snapshot()
}

// snapshot rebuilds the mix from the window's counts plus one for every
// shape seen, known or, while Assuming, assumed. With nothing of them it
// leaves the mix nil.
func (h *DemandHistory) snapshot() error {
	counts := maps.Clone(h.counts)
	for sh := range h.seen {
		counts[sh]++
	}
	if h.Assuming() && len(h.assumed) > 0 {
		host := h.medianHostPerGPU()
		for _, p := range h.assumed {
			if sh := (DemandShape{GPUs: 1, Host: host, Products: p}); !h.seen[sh] {
				counts[sh]++
			}
		}
	}
	if len(counts) == 0 {
		h.mix = nil
		return nil
	}
	m, err := NewDemandMix(counts)
	if err != nil {
		// Cannot happen: the shapes were validated and one count is
		// positive.
		return fmt.Errorf("demand history: %w", err)
	}
	h.mix = m
	return nil
}

// medianHostPerGPU is the (lower) median CPU and memory per GPU of the
// shapes recorded in the window and of those seen or known, each apart;
// zero when there are none.
func (h *DemandHistory) medianHostPerGPU() Host {
	cpu := make([]int64, 0, len(h.ring)+len(h.seen))
	mem := make([]int64, 0, cap(cpu))
	add := func(s DemandShape) {
		cpu = append(cpu, s.Host.CPUMilli/int64(s.GPUs))
		mem = append(mem, s.Host.MemoryBytes/int64(s.GPUs))
	}
	for _, s := range h.ring {
		add(s)
	}
	for s := range h.seen {
		add(s)
	}
	if len(cpu) == 0 {
		return Host{}
	}
	slices.Sort(cpu)
	slices.Sort(mem)
	return Host{CPUMilli: cpu[(len(cpu)-1)/2], MemoryBytes: mem[(len(mem)-1)/2]}
}

// Mix is the snapshot to rank with (Policy.Demand); nil before the first
// Record, Know or AssumeProducts with a product.
func (h *DemandHistory) Mix() *DemandMix { return h.mix }
