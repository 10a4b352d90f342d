package allocate

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// TestStrandCacheMatchesStrandDelta: over many node states on real
// topologies (two products, hosts from a short list so that states
// repeat, as in a cluster; more of them than the cache has slots), the
// stranding remembered across nodes, as chooseShare and chooseWhole share
// it, equals strandDelta's, for a share and for whole GPUs, under a mix
// that pins some shapes to a product; the cache is used; and a new
// ranking (begin) under another mix forgets the last one's.
func TestStrandCacheMatchesStrandDelta(t *testing.T) {
	topos := []*topology.Topology{v100(t), nvbridge(t), dgxA100(t), p40(t)}
	product := topos[0].GPUs[0].ProductName
	rng := rand.New(rand.NewPCG(3, 4))
	hosts := []*Host{nil, {CPUMilli: 4000, MemoryBytes: 16 * gib}, {CPUMilli: 64000, MemoryBytes: 512 * gib}}
	var nodes []*NodeState
	for range 3000 {
		tp := topos[rng.IntN(len(topos))]
		n := &NodeState{Name: "n", Topology: tp, Usage: make([]GPUUsage, tp.Len()), Host: hosts[rng.IntN(len(hosts))]}
		// Most nodes in one of a few states, a quarter in any.
		pattern := rand.New(rand.NewPCG(uint64(rng.IntN(4)), 0))
		if rng.IntN(4) == 0 {
			pattern = rng
		}
		for p := range tp.Len() {
			switch pattern.IntN(4) {
			case 0:
				n.Usage[p] = GPUUsage{Exclusive: true}
			case 1:
				n.Usage[p] = shared(1, 8, 25)
			}
		}
		nodes = append(nodes, n)
	}
	counts := map[DemandShape]int{
		{GPUs: 1, Host: Host{CPUMilli: 8000, MemoryBytes: 32 * gib}, Products: product}: 5,
		{GPUs: 2, Host: Host{CPUMilli: 2000, MemoryBytes: 8 * gib}}:                     3,
		{GPUs: 1, ShareMilli: 300, Host: Host{CPUMilli: 1000, MemoryBytes: 4 * gib}}:    4,
	}
	mix := mustDemand(t, counts).WithScarcity(nodes)
	cache := &strandCache{}
	for _, req := range []Request{share(4, 20), {GPUs: 2}, {GPUs: 1, Host: Host{CPUMilli: 3000, MemoryBytes: 8 * gib}}} {
		cache.begin()
		calls, computed := 0, 0
		for i, n := range nodes {
			var sets []uint64
			if req.Share != nil {
				// A fresh GPU and one that holds shares: the share strands
				// differently on each of one node.
				if free := freeMask(n); free != 0 {
					sets = append(sets, 1<<bits.TrailingZeros64(free))
				}
				for p := range n.Topology.Len() {
					if n.usage(p).Shares > 0 {
						sets = append(sets, 1<<p)
						break
					}
				}
			} else if cand := freeMask(n) & eligibleMask(n, req); bits.OnesCount64(cand) >= req.GPUs {
				sets = append(sets, lowestFreeSet(cand, req.GPUs))
			}
			for _, set := range sets {
				calls++
				if !cache.has(n, set) {
					computed++
				}
				if got, want := cache.delta(mix, n, req, set), strandDelta(mix, n, req, set); got != want {
					t.Fatalf("request %+v, node %d (%d GPUs, host %v, usage %v), GPUs %b: remembered %d, computed %d", req, i, n.Topology.Len(), n.Host, n.Usage, set, got, want)
				}
			}
		}
		if calls == 0 || computed >= calls/2 {
			t.Errorf("request %+v: %d placements scored, %d of them measured: want under half", req, calls, computed)
		}
	}
	// The same share on an idle node under another mix, in a new ranking:
	// whole GPUs asked for, the rest of its GPU is stranded; shares of a
	// tenth, it is not.
	n, req := &NodeState{Name: "idle", Topology: topos[0]}, share(4, 20)
	wholes := mustDemand(t, map[DemandShape]int{{GPUs: 1}: 1})
	tenths := mustDemand(t, map[DemandShape]int{{GPUs: 1, ShareMilli: 100}: 1})
	cache.begin()
	first := cache.delta(wholes, n, req, 1)
	cache.begin()
	if got, want := cache.delta(tenths, n, req, 1), strandDelta(tenths, n, req, 1); got != want || want == first {
		t.Errorf("after begin, under another mix: %d, want %d (and not the last ranking's %d)", got, want, first)
	}
}

// has tells whether the cache holds the state of n with set taken in this
// ranking (for the test's count of what it measured).
func (c *strandCache) has(n *NodeState, set uint64) bool {
	k := strandKey{t: n.Topology, set: set}
	gpuLeft(n, k.left[:0])
	if n.Host != nil {
		k.hostKnown, k.host = true, *n.Host
	}
	s := &c.slots[maphash.Comparable(c.seed, k)&(strandCacheSlots-1)]
	return s.gen == c.gen && s.key == k
}
