package allocate

import (
	"cmp"
	"fmt"
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
	var bufBefore, bufAfter [topology.MaxGPUs]int32
	before := gpuLeft(n, bufBefore[:0])
	after := append(bufAfter[:0], before...)
	takeFrom(after, n, req, set)
	return m.strandChange(before, after, n.Host, hostAfter(n, req.Host), nodeProduct(n))
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
// then the tie key (NodeState.TieKey, else the name), so that pods fill
// one domain of the cluster before the next as ChooseNode's do. Every
// node needs its Host; nodes the pod does not fit are skipped. Without
// pol.Demand only the later criteria apply.
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
				before, after := pol.Demand.strandedPair(left, left, n.Host, &c.after, product)
				c.delta = after - before
			}
		}
		better := best == nil
		if !better {
			o := cmp.Or(cmp.Compare(c.delta, best.delta), cmp.Compare(c.gpu, best.gpu),
				cmp.Compare(c.after.CPUMilli, best.after.CPUMilli), cmp.Compare(c.after.MemoryBytes, best.after.MemoryBytes),
				cmp.Compare(n.tie(), nodes[best.idx].tie()))
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
