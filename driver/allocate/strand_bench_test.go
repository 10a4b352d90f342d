package allocate

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkChooseNodeStranding: one decision ranked by stranding
// (Policy.Demand), the replay's and the controller's exhaustive path, on
// 1,000 8-GPU nodes of four products, a third of them partly given out
// and a sixth holding shares, under a mix of 512 shapes as FGD's lists
// with GPU-model constraints make (whole and shares, about a third pinned
// to one or two products), weighed by scarcity.
func BenchmarkChooseNodeStranding(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	products := []string{"A100", "H100", "V100", "T4"}
	nodes := make([]*NodeState, 1000)
	for i := range nodes {
		host := Host{CPUMilli: 96000 - int64(rng.IntN(64))*1000, MemoryBytes: 384*gib - int64(rng.IntN(128))*gib}
		n := nodeNow(b, 8, host, products[i%len(products)], rng.IntN(9)*(i%3/2))
		if i%6 == 0 {
			for p := range n.Usage {
				if !n.Usage[p].Exclusive {
					n.Usage[p] = GPUUsage{Shares: 1, MemoryBytes: int64(1+rng.IntN(12)) * gib, Cores: int64(10 * (1 + rng.IntN(5)))}
				}
			}
		}
		n.Name = "node-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
		nodes[i] = n
	}
	counts := map[DemandShape]int{}
	for len(counts) < 512 {
		s := DemandShape{GPUs: 1 << rng.IntN(4), Host: Host{CPUMilli: int64(1+rng.IntN(32)) * 1000, MemoryBytes: int64(1+rng.IntN(64)) * gib}}
		if rng.IntN(3) == 0 {
			s.GPUs, s.ShareMilli = 1, 100*(1+rng.IntN(9))
		}
		switch rng.IntN(6) {
		case 0, 1:
			s.Products = products[rng.IntN(len(products))]
		case 2:
			s.Products = ProductsKey([]string{products[rng.IntN(2)], products[2+rng.IntN(2)]})
		}
		counts[s] = 1 + rng.IntN(50)
	}
	pol := Policy{Node: Binpack, GPU: Binpack, Demand: mustDemand(b, counts).WithScarcity(nodes)}
	for _, bc := range []struct {
		name string
		req  Request
	}{
		{"share", Request{Share: &ShareRequest{MemoryBytes: 8 * gib, Cores: 30}, Host: Host{CPUMilli: 4000, MemoryBytes: 16 * gib}}},
		{"whole-1", Request{GPUs: 1, Host: Host{CPUMilli: 8000, MemoryBytes: 32 * gib}}},
		{"whole-4", Request{GPUs: 4, Host: Host{CPUMilli: 16000, MemoryBytes: 64 * gib}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ChooseNode(nodes, bc.req, pol); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
