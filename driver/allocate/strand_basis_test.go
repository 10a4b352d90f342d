package allocate

import (
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// TestWithStrandedMatchesScoreNode checks that a score kept with its
// StrandBasis and ranked under another demand mix (NodeScore.WithStranded)
// is the score ScoreNode gives under that mix, over random nodes (some
// with CPU and memory left, of products some shapes exclude), usage,
// whole and share requests and mixes (some costing the GPU taken, as
// for an over-demanded product).
func TestWithStrandedMatchesScoreNode(t *testing.T) {
	hetero := withMemory(t, v100(t), 16*gib)
	hetero.GPUs[3].MemoryBytes = 32 * gib
	topos := []*topology.Topology{v100(t), p40(t), nvbridge(t), dgxA100(t), dgx2(t), pcie16(t), pcie4(t), hetero}
	rng := rand.New(rand.NewPCG(21, 22))
	compared := 0
	for trial := range 2000 {
		topo := topos[rng.IntN(len(topos))]
		n := &NodeState{Name: "n", Topology: topo, Usage: randomUsage(rng, topo, rng.Float64())}
		if rng.IntN(4) != 0 {
			n.Host = &Host{CPUMilli: int64(rng.IntN(64000)), MemoryBytes: int64(rng.IntN(256)) * gib}
		}
		var req Request
		if rng.IntN(3) == 0 {
			req.Share = &ShareRequest{MemoryBytes: int64(1+rng.IntN(8)) * gib, Cores: int64(5 + rng.IntN(50))}
		} else {
			req.GPUs = 1 + rng.IntN(8)
		}
		req.Host = Host{CPUMilli: int64(rng.IntN(16000)), MemoryBytes: int64(rng.IntN(64)) * gib}
		pol := Policy{Node: []Strategy{Binpack, Spread}[rng.IntN(2)], GPU: []Strategy{Binpack, Spread}[rng.IntN(2)], Demand: randomDemand(rng)}
		s, basis, ok, err := ScoreNodeWithBasis(n, req, pol)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		plain, plainOK, _ := ScoreNode(n, req, pol)
		if ok != plainOK || s != plain {
			t.Fatalf("trial %d: ScoreNodeWithBasis %+v %v, ScoreNode %+v %v", trial, s, ok, plain, plainOK)
		}
		if !ok {
			if basis != nil {
				t.Fatalf("trial %d: a basis for a request that does not fit", trial)
			}
			continue
		}
		// The caller's host may change once scored: the basis keeps its own.
		if n.Host != nil {
			n.Host.CPUMilli = -1
		}
		other := pol
		other.Demand = randomDemand(rng)
		if rng.IntN(2) == 0 {
			// The topologies name no product: cost the GPU taken on
			// theirs, as WithScarcity does for an over-demanded one.
			costed := *other.Demand
			costed.overdemand = map[string]overdemandCost{"": {weight: int64(1 + rng.IntN(1000)),
				cpuPerMilli: float64(rng.IntN(20)), memoryPerMilli: float64(rng.IntN(3)) * float64(gib) / 1000}}
			other.Demand = &costed
		}
		if n.Host != nil {
			n.Host.CPUMilli = basis.hostBefore.CPUMilli
		}
		want, _, _ := ScoreNode(n, req, other)
		if got := s.WithStranded(other.Demand, basis); got != want {
			t.Fatalf("trial %d: restranded %+v, ScoreNode under the other mix %+v", trial, got, want)
		}
		compared++
	}
	if compared < 500 {
		t.Fatalf("only %d scores compared", compared)
	}
}
