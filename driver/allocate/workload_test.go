package allocate

import (
	"context"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
)

// myopic takes the best set by criteria 1-2 alone (weakest link, then
// aggregate), lowest positions on a tie: the best set now, with no regard
// for what is left.
func myopic(n *NodeState, k int) []int {
	free := freeMask(n)
	if bits.OnesCount64(free) < k {
		return nil
	}
	p := boundSearch(n.Topology, free, k, topology.LinkNone)
	if !p.found {
		return nil
	}
	return positions(p.set)
}

// churnStats counts how a placement rule served a workload.
type churnStats struct {
	multi, placed, ideal, failed int
}

func (s churnStats) share() float64 {
	if s.placed == 0 {
		return 1
	}
	return float64(s.ideal) / float64(s.placed)
}

// workload is a deterministic random allocate/free sequence: sizes drawn
// from mix (weight per size, index = size), a free of a random live
// allocation with probability freeP.
type workload struct {
	name  string
	mix   []float64
	freeP float64
}

var workloads = []workload{
	{"uniform-1-8", []float64{0, 1, 1, 1, 1, 1, 1, 1, 1}, 0.45},
	{"uniform-light", []float64{0, 1, 1, 1, 1, 1, 1, 1, 1}, 0.6},
	{"small", []float64{0, 6, 4, 1, 2}, 0.45},
	{"small-light", []float64{0, 6, 4, 1, 2}, 0.55},
	{"pow2", []float64{0, 3, 3, 0, 2, 0, 0, 0, 1}, 0.45},
	{"large", []float64{0, 1, 2, 1, 3, 0, 1, 0, 2}, 0.5},
	{"odd", []float64{0, 2, 1, 3, 0, 2}, 0.5},
}

func (w workload) sizeMix() *SizeMix {
	freq := map[int]float64{}
	for s, f := range w.mix {
		if f > 0 {
			freq[s] = f
		}
	}
	return mustSizeMix(freq)
}

func gpulinkMix(mix *SizeMix) func(*NodeState, int) []int {
	return func(n *NodeState, k int) []int {
		r, err := Allocate(n, Request{GPUs: k}, Policy{Mix: mix})
		if err != nil {
			return nil
		}
		return r.GPUs
	}
}

// idealClasses is, per size, the weakest link of the best set of that size
// on the idle node: the class a request gets when nothing is in its way.
func idealClasses(t *topology.Topology) []topology.Link {
	out := make([]topology.Link, t.Len()+1)
	all := fullMask(t.Len())
	for k := 2; k <= t.Len() && k <= 8; k++ {
		out[k] = boundSearch(t, all, k, topology.LinkNone).key.link()
	}
	return out
}

func drawSize(rng *rand.Rand, mix []float64, n int) int {
	var total float64
	for s, w := range mix {
		if s <= n {
			total += w
		}
	}
	x := rng.Float64() * total
	for s, w := range mix {
		if s > n {
			break
		}
		if x < w {
			return s
		}
		x -= w
	}
	return 1
}

// playChurn runs steps of a workload with the given seed through pick and
// reports the ideal-class share of multi-GPU requests. The sequence of
// requests and frees depends only on the seed and which requests failed.
func playChurn(tb testing.TB, topo *topology.Topology, pick func(*NodeState, int) []int, w workload, seed uint64, steps int) churnStats {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b9))
	ideal := idealClasses(topo)
	node := nodeWith("node-a", topo)
	var live []Result
	var st churnStats
	for range steps {
		if len(live) > 0 && rng.Float64() < w.freeP {
			i := rng.IntN(len(live))
			if err := node.Release(Request{GPUs: len(live[i].GPUs)}, live[i]); err != nil {
				tb.Fatal(err)
			}
			live = append(live[:i], live[i+1:]...)
			continue
		}
		k := drawSize(rng, w.mix, topo.Len())
		if k >= 2 {
			st.multi++
		}
		if node.FreeGPUs() < k {
			st.failed++
			continue
		}
		set := pick(node, k)
		if len(set) != k {
			tb.Fatalf("no %d GPUs with %d free", k, node.FreeGPUs())
		}
		var mask uint64
		for _, p := range set {
			mask |= 1 << p
		}
		r := Result{Node: "node-a", GPUs: set, WeakestLink: setKey(topo, mask).link()}
		if k >= 2 {
			st.placed++
			if r.WeakestLink >= ideal[k] {
				st.ideal++
			}
		}
		if err := node.Commit(Request{GPUs: k}, r); err != nil {
			tb.Fatal(err)
		}
		live = append(live, r)
	}
	return st
}

// churnTopologies are the topologies churn is measured on: the fixtures
// and the go-nvml mock machines.
func churnTopologies(tb testing.TB) []namedTopology {
	tb.Helper()
	out := allTopologies(tb)
	for _, name := range discovery.MockServers() {
		d, err := discovery.NewMock(name)
		if err != nil {
			tb.Fatal(err)
		}
		topo, err := d.Discover(context.Background())
		if err != nil {
			tb.Fatalf("mock %s: %v", name, err)
		}
		out = append(out, namedTopology{"mock-" + name, topo})
	}
	return out
}

// churnAllocators are gpulink (told the workload's size mix, as the
// controller would be) and the three baselines.
func churnAllocators(w workload) []allocator {
	return []allocator{
		{"gpulink", gpulinkMix(w.sizeMix())},
		{"myopic", myopic},
		{"first-fit", firstFit},
		{"greedy", greedyPrim},
	}
}

// churnTotals plays every workload with seeds 1..seeds on one topology and
// sums the counts per allocator.
func churnTotals(tb testing.TB, topo *topology.Topology, seeds uint64, steps int) []churnStats {
	tb.Helper()
	var tot []churnStats
	for _, w := range workloads {
		algs := churnAllocators(w)
		if tot == nil {
			tot = make([]churnStats, len(algs))
		}
		for i, a := range algs {
			for seed := uint64(1); seed <= seeds; seed++ {
				s := playChurn(tb, topo, a.pick, w, seed, steps)
				tot[i].multi += s.multi
				tot[i].placed += s.placed
				tot[i].ideal += s.ideal
				tot[i].failed += s.failed
			}
		}
	}
	return tot
}

// TestChurnNeverWorseThanMyopic plays seeded random allocate/free
// workloads on every topology and checks that gpulink puts at least as
// many multi-GPU requests on their ideal link class as the myopic
// allocator, which takes the best set now with no regard for the rest.
func TestChurnNeverWorseThanMyopic(t *testing.T) {
	steps := 1000
	if testing.Short() {
		steps = 300
	}
	for _, nt := range churnTopologies(t) {
		t.Run(nt.name, func(t *testing.T) {
			tot := churnTotals(t, nt.topo, 2, steps)
			g, m := tot[0], tot[1]
			if g.placed != m.placed {
				t.Fatalf("gpulink placed %d multi-GPU requests, myopic %d: the workloads differ", g.placed, m.placed)
			}
			if g.ideal < m.ideal {
				t.Errorf("gpulink put %d of %d multi-GPU requests on the ideal class, myopic %d", g.ideal, g.placed, m.ideal)
			}
		})
	}
}

// BenchmarkChurn prints, per topology, the share of multi-GPU requests
// placed on their ideal link class and the failures (requests finding too
// few free GPUs) for gpulink and the three baselines, over every workload
// with fixed seeds: the figures are the same on every run.
func BenchmarkChurn(b *testing.B) {
	for _, nt := range churnTopologies(b) {
		b.Run(nt.name, func(b *testing.B) {
			var tot []churnStats
			for range b.N {
				tot = churnTotals(b, nt.topo, 3, 1000)
			}
			for i, a := range churnAllocators(workloads[0]) {
				b.ReportMetric(tot[i].share(), a.name+"-ideal")
				b.ReportMetric(float64(tot[i].failed), a.name+"-failed")
			}
		})
	}
}
