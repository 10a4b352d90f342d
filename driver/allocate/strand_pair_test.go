package allocate

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestStrandedPairMatchesStranded: the one pass over the shapes for two
// states of a node gives what two passes give, one per state, whatever
// the GPU left, hosts (known, short, unknown) and product, with shapes
// whole and shared, free and pinned to one or several products.
func TestStrandedPairMatchesStranded(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	products := []string{"A100", "H100", "T4"}
	counts := map[DemandShape]int{}
	for len(counts) < 96 {
		s := DemandShape{GPUs: 1 << rng.IntN(4), Host: Host{CPUMilli: int64(rng.IntN(32)) * 1000, MemoryBytes: int64(rng.IntN(64)) * gib}}
		if rng.IntN(3) == 0 {
			s.GPUs, s.ShareMilli = 1, 50*(1+rng.IntN(19))
		}
		switch rng.IntN(4) {
		case 0:
			s.Products = products[rng.IntN(len(products))]
		case 1:
			s.Products = ProductsKey([]string{products[0], products[1+rng.IntN(2)]})
		}
		counts[s] = 1 + rng.IntN(20)
	}
	plain := mustDemand(t, counts)
	nodes := []*NodeState{nodeNow(t, 8, Host{CPUMilli: 64000, MemoryBytes: 256 * gib}, "T4", 3), nodeNow(t, 8, Host{}, "A100", 0)}
	mixes := map[string]*DemandMix{"plain": plain, "scarcity": plain.WithScarcity(nodes)}
	left := func() []int32 {
		l := make([]int32, 1+rng.IntN(8))
		for i := range l {
			switch rng.IntN(3) {
			case 0:
				l[i] = 0
			case 1:
				l[i] = milliPerGPU
			default:
				l[i] = int32(rng.IntN(milliPerGPU))
			}
		}
		return l
	}
	host := func() *Host {
		if rng.IntN(4) == 0 {
			return nil
		}
		return &Host{CPUMilli: int64(rng.IntN(48)) * 1000, MemoryBytes: int64(rng.IntN(128)) * gib}
	}
	// The shapes' products, none, and one no shape names.
	nodeProducts := append(slices.Clone(products), "", "V100")
	for name, m := range mixes {
		for i := range 500 {
			before, after := left(), left()
			hb, ha := host(), host()
			product := nodeProducts[rng.IntN(len(nodeProducts))]
			b, a := m.strandedPair(before, after, hb, ha, product)
			if wb, wa := m.stranded(before, hb, product), m.stranded(after, ha, product); b != wb || a != wa {
				t.Fatalf("%s, case %d (before %v host %+v, after %v host %+v, product %q): pair = %d, %d; alone = %d, %d",
					name, i, before, hb, after, ha, product, b, a, wb, wa)
			}
		}
	}
}

// TestAdmitsAt: a shape pinned to products admits a node of one of them,
// named whole, and nothing else; a shape pinned to none admits any node.
func TestAdmitsAt(t *testing.T) {
	host := Host{CPUMilli: 1000}
	shapes := []DemandShape{
		{GPUs: 1, Host: host},
		{GPUs: 1, Host: host, Products: "T4"},
		{GPUs: 2, Host: host, Products: ProductsKey([]string{"V100M32", "V100M16"})},
	}
	counts := map[DemandShape]int{}
	for _, s := range shapes {
		counts[s] = 1
	}
	m := mustDemand(t, counts)
	index := map[string]int{}
	for i, s := range m.shapes {
		index[s.Products] = i
	}
	for _, tc := range []struct {
		products, node string
		want           bool
	}{
		{"", "T4", true},
		{"", "", true},
		{"T4", "T4", true},
		{"T4", "T", false},
		{"T4", "", false},
		{"V100M16|V100M32", "V100M16", true},
		{"V100M16|V100M32", "V100M32", true},
		{"V100M16|V100M32", "V100M16|V100M32", false},
		{"V100M16|V100M32", "V100", false},
	} {
		if got := m.admitsAt(index[tc.products], tc.node); got != tc.want {
			t.Errorf("shape pinned to %q, node of %q: admitsAt = %v, want %v", tc.products, tc.node, got, tc.want)
		}
	}
}
