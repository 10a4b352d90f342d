package allocate

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// randomUsage gives each GPU of t a random state: free, whole, or shares.
func randomUsage(rng *rand.Rand, t *topology.Topology, busy float64) []GPUUsage {
	u := make([]GPUUsage, t.Len())
	for p := range u {
		if rng.Float64() >= busy {
			continue
		}
		if rng.IntN(2) == 0 {
			u[p] = GPUUsage{Exclusive: true}
			continue
		}
		sh := 1 + rng.IntN(3)
		u[p] = GPUUsage{Shares: sh, MemoryBytes: int64(sh) * gib, Cores: int64(sh * (5 + rng.IntN(20)))}
	}
	return u
}

// TestScoreNodeAgreesWithChooseNode checks that ranking nodes one by one
// with ScoreNode and Better picks the node ChooseNode picks, on random
// clusters of mixed topologies (one with GPUs of two memory sizes), random
// usage, whole and share requests, eligibility masks and both strategies;
// and that a score that does not depend on the mix is the same under
// another mix.
func TestScoreNodeAgreesWithChooseNode(t *testing.T) {
	hetero := withMemory(t, v100(t), 16*gib)
	hetero.GPUs[3].MemoryBytes = 32 * gib
	topos := []*topology.Topology{v100(t), p40(t), nvbridge(t), dgxA100(t), dgx2(t), pcie16(t), pcie4(t), hetero}
	otherMix := mustSizeMix(map[int]float64{1: 5, 2: 1, 8: 3})
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 400 {
		nodes := make([]*NodeState, 2+rng.IntN(12))
		for i := range nodes {
			topo := topos[rng.IntN(len(topos))]
			// Some names repeat a length class so that ties on score
			// are broken by name, in an order unrelated to input order.
			nodes[i] = &NodeState{Name: fmt.Sprintf("n-%02d", rng.IntN(100)*len(nodes)+i), Topology: topo, Usage: randomUsage(rng, topo, rng.Float64())}
		}
		var req Request
		if rng.IntN(3) == 0 {
			req.Share = &ShareRequest{MemoryBytes: int64(1+rng.IntN(8)) * gib, Cores: int64(5 + rng.IntN(50))}
		} else {
			req.GPUs = 1 + rng.IntN(8)
			if rng.IntN(4) == 0 {
				req.RequiredLink = topology.LinkNVLink
			}
		}
		if rng.IntN(3) == 0 {
			req.EligibleByNode = map[string][]bool{}
			for _, n := range nodes {
				e := make([]bool, n.Topology.Len())
				for p := range e {
					e[p] = rng.IntN(4) != 0
				}
				req.EligibleByNode[n.Name] = e
			}
		}
		pol := Policy{Node: []Strategy{Binpack, Spread}[rng.IntN(2)], GPU: []Strategy{Binpack, Spread}[rng.IntN(2)]}
		if rng.IntN(2) == 0 {
			pol.Mix = mustSizeMix(map[int]float64{1: 1, 2: 2, 4: float64(1 + rng.IntN(4))})
		}
		if rng.IntN(2) == 0 {
			// Host-aware: nodes with CPU and memory left (some short of
			// the request), and a demand mix to strand against.
			pol.Demand = randomDemand(rng)
			req.Host = Host{CPUMilli: int64(rng.IntN(16000)), MemoryBytes: int64(rng.IntN(64)) * gib}
			for _, n := range nodes {
				if rng.IntN(5) != 0 {
					n.Host = &Host{CPUMilli: int64(rng.IntN(64000)), MemoryBytes: int64(rng.IntN(256)) * gib}
				}
			}
		}
		want, chooseErr := ChooseNode(nodes, req, pol)
		best := -1
		var bestScore NodeScore
		for i, n := range nodes {
			s, ok, err := ScoreNode(n, req, pol)
			if err != nil {
				t.Fatalf("trial %d: ScoreNode(%s): %v", trial, n.Name, err)
			}
			if !ok {
				continue
			}
			if !s.DependsOnMix() {
				if s2, ok2, _ := ScoreNode(n, req, Policy{Node: pol.Node, GPU: pol.GPU, Mix: otherMix, Demand: pol.Demand}); !ok2 || s2 != s {
					t.Fatalf("trial %d: node %s: score %+v under another mix is %+v (fits %v), but it does not depend on the mix", trial, n.Name, s, s2, ok2)
				}
			}
			if best < 0 || s.Better(bestScore, n.Name, nodes[best].Name, pol) {
				best, bestScore = i, s
			}
		}
		if best < 0 {
			if chooseErr == nil {
				t.Fatalf("trial %d: ChooseNode chose %s, no node scored", trial, want.Node)
			}
			continue
		}
		if chooseErr != nil {
			t.Fatalf("trial %d: node %s scored, ChooseNode: %v", trial, nodes[best].Name, chooseErr)
		}
		if want.Node != nodes[best].Name {
			t.Fatalf("trial %d (req %+v, policy %+v): ChooseNode chose %s, ScoreNode ranks %s first", trial, req, pol, want.Node, nodes[best].Name)
		}
	}
}

func TestScoreNodeRefusesBadInput(t *testing.T) {
	n := &NodeState{Name: "a", Topology: pcie4(t)}
	for name, tc := range map[string]struct {
		n   *NodeState
		req Request
	}{
		"no GPUs":        {n, Request{}},
		"eligible size":  {n, Request{GPUs: 1, Eligible: []bool{true}}},
		"nil topology":   {&NodeState{Name: "b"}, Request{GPUs: 1}},
		"negative usage": {&NodeState{Name: "c", Topology: pcie4(t), Usage: []GPUUsage{{Shares: -1}, {}, {}, {}}}, Request{GPUs: 1}},
	} {
		if _, ok, err := ScoreNode(tc.n, tc.req, Policy{}); err == nil || ok {
			t.Errorf("%s: want an error, got ok=%v err=%v", name, ok, err)
		}
	}
}
