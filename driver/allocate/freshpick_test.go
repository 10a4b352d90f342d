package allocate

import (
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// TestFreshPicksMatchSearch: over many node states on real topologies,
// a share placed with a freshPicks shared by every node (as chooseShare
// does) lands where it lands without one, and the memo is used: most
// states repeat, as the nodes of a cluster do.
func TestFreshPicksMatchSearch(t *testing.T) {
	topos := []*topology.Topology{v100(t), p40(t), nvbridge(t), dgxA100(t), pcie16(t), nvlinkTiered(t)}
	mix := DefaultSizeMix
	rng := rand.New(rand.NewPCG(1, 2))
	picks := freshPicks{}
	sc := getScratch()
	defer putScratch(sc)
	calls, fresh := 0, 0
	for _, spread := range []bool{false, true} {
		for range 2000 {
			tp := topos[rng.IntN(len(topos))]
			n := &NodeState{Name: "n", Topology: tp, Usage: make([]GPUUsage, tp.Len())}
			for p := range tp.Len() {
				switch rng.IntN(4) {
				case 0:
					n.Usage[p] = GPUUsage{Exclusive: true}
				case 1:
					n.Usage[p] = shared(1, 2, 10)
				}
			}
			req := share(1+int64(rng.IntN(4)), 10)
			if rng.IntN(2) == 0 {
				// Some free GPUs out of reach: fresh is then a strict
				// subset of free, and the pick depends on both.
				req.Eligible = make([]bool, tp.Len())
				for p := range req.Eligible {
					req.Eligible[p] = rng.IntN(3) > 0
				}
			}
			want, whyWant := placeShare(sc, n, req, spread, mix, nil)
			got, whyGot := placeShare(sc, n, req, spread, mix, picks)
			calls++
			if want.fresh {
				fresh++
			}
			if got != want || whyGot != whyWant {
				t.Fatalf("%d GPUs, usage %v, spread %v: with the memo %+v %q, without %+v %q", tp.Len(), n.Usage, spread, got, whyGot, want, whyWant)
			}
		}
	}
	if fresh == 0 || len(picks) >= fresh {
		t.Errorf("%d placements on a fresh GPU remembered %d picks: want some, and fewer than the placements", fresh, len(picks))
	}
	t.Logf("%d placements, %d on a fresh GPU, %d picks remembered", calls, fresh, len(picks))
}
