package allocate

import (
	"cmp"
	"fmt"
	"maps"
	"math/bits"
	"sync"

	"github.com/gpulink/gpulink/driver/topology"
)

// Host is CPU and memory: what a node has left for pods (NodeState.Host)
// or what a pod asks for (Request.Host).
type Host struct {
	CPUMilli    int64
	MemoryBytes int64
}

func (h Host) validate(field string) error {
	if h.CPUMilli < 0 || h.MemoryBytes < 0 {
		return fmt.Errorf("%s: cpuMilli and memoryBytes must be >= 0, got %d and %d", field, h.CPUMilli, h.MemoryBytes)
	}
	return nil
}

func (h Host) fits(in Host) bool { return h.CPUMilli <= in.CPUMilli && h.MemoryBytes <= in.MemoryBytes }

// gpuLeft is what is unallocated of each GPU of n, in milli GPU: a whole
// GPU is gone when given out whole, a shared one has what its dominant
// share (memory or cores) leaves.
func gpuLeft(n *NodeState, out []int32) []int32 {
	out = out[:0]
	for p := range n.Topology.Len() {
		u := n.usage(p)
		switch {
		case u.Exclusive:
			out = append(out, 0)
		case u.Shares == 0:
			out = append(out, milliPerGPU)
		default:
			out = append(out, milliPerGPU-shareMilli(ShareRequest{MemoryBytes: u.MemoryBytes, Cores: u.Cores}, n.Topology.GPUs[p].MemoryBytes))
		}
	}
	return out
}

// shareMilli is the dominant fraction of a GPU of total bytes that s
// takes, in milli GPU (rounded up, at most a whole GPU).
func shareMilli(s ShareRequest, total int64) int32 {
	m := s.Cores * milliPerGPU / maxShareCores
	if total > 0 {
		m = max(m, (s.MemoryBytes*milliPerGPU+total-1)/total)
	}
	return int32(min(m, milliPerGPU))
}

// nodeProduct is the product of n's GPUs, as DemandShape.Products names
// them ("" for a node without GPUs or whose first GPU names none).
func nodeProduct(n *NodeState) string {
	if n.Topology == nil || n.Topology.Len() == 0 {
		return ""
	}
	return n.Topology.GPUs[0].ProductName
}

// hostAfter is what the node's host has left once the request is placed
// (nil when the node's host is unknown).
func hostAfter(n *NodeState, req Host) *Host {
	if n.Host == nil {
		return nil
	}
	return &Host{CPUMilli: n.Host.CPUMilli - req.CPUMilli, MemoryBytes: n.Host.MemoryBytes - req.MemoryBytes}
}

// strandDelta is how much more GPU the mix strands on n once the request
// takes the GPUs in set (whole) or the share on GPU pos (set has that one
// bit), as stranded counts it.
func strandDelta(m *DemandMix, n *NodeState, req Request, set uint64) int64 {
	var buf [topology.MaxGPUs]int32
	left := gpuLeft(n, buf[:0])
	product := nodeProduct(n)
	before := m.stranded(left, n.Host, product)
	takeFrom(left, n, req, set)
	return m.stranded(left, hostAfter(n, req.Host), product) - before
}

// takeFrom takes the request's GPUs in set (whole) or its share on GPU
// pos (set has that one bit) from left, what gpuLeft gives of n.
func takeFrom(left []int32, n *NodeState, req Request, set uint64) {
	for a := set; a != 0; a &= a - 1 {
		p := bits.TrailingZeros64(a)
		if req.Share != nil {
			left[p] = max(0, left[p]-shareMilli(*req.Share, n.Topology.GPUs[p].MemoryBytes))
		} else {
			left[p] = 0
		}
	}
}

// lowestFreeSet is k free GPUs of n, the lowest positions: the stranding
// of whole GPUs does not depend on which free ones are taken.
func lowestFreeSet(free uint64, k int) uint64 {
	var s uint64
	for a := free; a != 0 && k > 0; a &= a - 1 {
		s |= a & -a
		k--
	}
	return s
}

// idealKey is the best quality a set of k GPUs gets on an idle node of
// topology t: a set reaching its weakest link is on the node's ideal link
// class. Kept per topology, as nodes of one kind share their topology.
func idealKey(t *topology.Topology, k int) key {
	if k < 2 {
		return singleKey
	}
	ik := idealMemoKey{t: t, k: k}
	idealMemo.mu.Lock()
	v, ok := idealMemo.m[ik]
	idealMemo.mu.Unlock()
	if ok {
		return v
	}
	sc := getScratch()
	all := fullMask(t.Len())
	p := pickWhole(sc, t, all, all, k, topology.LinkNone, false, nil)
	putScratch(sc)
	idealMemo.mu.Lock()
	if len(idealMemo.m) >= memoMaxEntries {
		clear(idealMemo.m)
	}
	idealMemo.m[ik] = p.key
	idealMemo.mu.Unlock()
	return p.key
}

type idealMemoKey struct {
	t *topology.Topology
	k int
}

var idealMemo = struct {
	mu sync.Mutex
	m  map[idealMemoKey]key
}{m: map[idealMemoKey]key{}}

// ChooseHost places a pod that asks for no GPU (CPU and memory only) on
// one of nodes, so that it strands the least GPU of the pods to come:
// the node where its CPU and memory leave pol.Demand's shapes the most
// GPUs they can still use (criterion as in ChooseNode), then the node
// with the least unallocated GPU (nodes without GPUs, Topology nil,
// first), then the least CPU, then memory, left afterwards (packing),
// then name. Every node needs its Host; nodes the pod does not fit are
// skipped. Without pol.Demand only the later criteria apply.
func ChooseHost(nodes []*NodeState, req Host, pol Policy) (string, error) {
	if err := req.validate("request.host"); err != nil {
		return "", err
	}
	type cand struct {
		idx        int
		delta, gpu int64
		after      Host
	}
	var best *cand
	var buf [topology.MaxGPUs]int32
	for i, n := range nodes {
		if n == nil || n.Host == nil {
			return "", fmt.Errorf("nodes[%d]: host is not set", i)
		}
		if n.Topology != nil {
			if err := n.Validate(); err != nil {
				return "", fmt.Errorf("nodes[%d]: %w", i, err)
			}
		}
		if !req.fits(*n.Host) {
			continue
		}
		c := cand{idx: i, after: *hostAfter(n, req)}
		if n.Topology != nil {
			left := gpuLeft(n, buf[:0])
			for _, l := range left {
				c.gpu += int64(l)
			}
			if pol.Demand != nil {
				product := nodeProduct(n)
				c.delta = pol.Demand.stranded(left, &c.after, product) - pol.Demand.stranded(left, n.Host, product)
			}
		}
		better := best == nil
		if !better {
			o := cmp.Or(cmp.Compare(c.delta, best.delta), cmp.Compare(c.gpu, best.gpu),
				cmp.Compare(c.after.CPUMilli, best.after.CPUMilli), cmp.Compare(c.after.MemoryBytes, best.after.MemoryBytes),
				cmp.Compare(n.Name, nodes[best.idx].Name))
			better = o < 0
		}
		if better {
			best = &c
		}
	}
	if best == nil {
		return "", &UnsatisfiableError{Reason: hostShortReason(Request{Host: req}, len(nodes))}
	}
	return nodes[best.idx].Name, nil
}

// DemandHistory is the recent GPU pods a controller was asked to place,
// as DemandShapes: the counts over the last window pods, plus a
// pseudo-count of one for every shape ever recorded (up to
// maxSeenShapes of them), snapshot into a DemandMix every refresh pods
// (and at the first, so that decisions have a mix from the start). The
// pseudo-count is for the rare, large pods: a pod that takes a whole
// node of the only kind big enough for it comes a few times in
// thousands, so a window of recent pods mostly misses it, and without
// weight nothing would keep such a node whole for it (as SizeHistory's
// prior keeps every size 1..8 a weight). Like SizeHistory it is a pure
// function of the recorded sequence. Not safe for concurrent use.
type DemandHistory struct {
	window, refresh int
	ring            []DemandShape
	next            int
	counts          map[DemandShape]int
	seen            map[DemandShape]bool
	since           int
	mix             *DemandMix
}

// maxSeenShapes bounds the shapes DemandHistory gives a pseudo-count:
// shapes first recorded after that many others get none.
const maxSeenShapes = 4 * maxDemandShapes

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
	if h.mix == nil || h.since >= h.refresh {
		h.since = 0
		return h.snapshot()
	}
	return nil
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

// snapshot rebuilds the mix from the window's counts plus one for every
// shape seen or known.
func (h *DemandHistory) snapshot() error {
	counts := maps.Clone(h.counts)
	for sh := range h.seen {
		counts[sh]++
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

// Mix is the snapshot to rank with (Policy.Demand); nil before the first
// Record or Know.
func (h *DemandHistory) Mix() *DemandMix { return h.mix }
