package allocate

import (
	"context"
	"math/bits"
	"math/rand/v2"
	"sync"
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
// failed counts requests that found too few free GPUs, stranded those
// that found enough but none on the class they required.
type churnStats struct {
	multi, placed, ideal, failed, stranded int
}

func (s churnStats) share() float64 {
	if s.multi == 0 {
		return 1
	}
	return float64(s.ideal) / float64(s.multi)
}

// workload is a deterministic random allocate/free sequence: sizes drawn
// from mix (weight per size, index = size), a free of a random live
// allocation with probability freeP. With probability strictP a
// multi-GPU request requires its ideal class (a job that asks for
// NVLink, say): a set below it is a failure and holds nothing. With
// drain, a live allocation is also freed whenever at most one GPU is left
// free (a busy node whose jobs end as fast as they come). steps is the
// sequence length of a family (churnFamilies); the workloads of
// BenchmarkChurn set their own.
type workload struct {
	name    string
	mix     []float64
	freeP   float64
	strictP float64
	drain   bool
	steps   int
}

var workloads = []workload{
	{"uniform-1-8", []float64{0, 1, 1, 1, 1, 1, 1, 1, 1}, 0.45, 0, false, 1000},
	{"uniform-light", []float64{0, 1, 1, 1, 1, 1, 1, 1, 1}, 0.6, 0, false, 1000},
	{"small", []float64{0, 6, 4, 1, 2}, 0.45, 0, false, 1000},
	{"small-light", []float64{0, 6, 4, 1, 2}, 0.55, 0, false, 1000},
	{"pow2", []float64{0, 3, 3, 0, 2, 0, 0, 0, 1}, 0.45, 0, false, 1000},
	{"large", []float64{0, 1, 2, 1, 3, 0, 1, 0, 2}, 0.5, 0, false, 1000},
	{"odd", []float64{0, 2, 1, 3, 0, 2}, 0.5, 0, false, 1000},
	{"uniform-strict", []float64{0, 1, 1, 1, 1, 1, 1, 1, 1}, 0.45, 0.3, false, 1000},
	{"small-strict", []float64{0, 6, 4, 1, 2}, 0.45, 0.3, false, 1000},
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
// Kept per topology: the search takes tens of milliseconds on 32 GPUs,
// more than a whole sequence of allocations.
func idealClasses(t *topology.Topology) []topology.Link {
	if v, ok := idealClassCache.Load(t); ok {
		return v.([]topology.Link)
	}
	out := make([]topology.Link, t.Len()+1)
	all := fullMask(t.Len())
	for k := 2; k <= t.Len() && k <= 8; k++ {
		out[k] = boundSearch(t, all, k, topology.LinkNone).key.link()
	}
	idealClassCache.Store(t, out)
	return out
}

var idealClassCache sync.Map // *topology.Topology -> []topology.Link

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

// churnOp is one step of a workload: allocate size GPUs under a new id
// (size > 0), or free the allocation with id free.
type churnOp struct {
	size   int
	strict bool
	full   bool // the GPUs held by earlier requests leave too few
	free   int
}

// churnOps draws a workload's steps from the seed alone, so every
// allocator sees the same requests and frees. The draw tracks how many
// GPUs the requests so far hold, so a request that cannot fit is known
// here and fails for every allocator, and frees name only requests that
// fit; a free of a request an allocator stranded does nothing. An
// allocator never holds more than the draw counts, so every request the
// draw lets fit finds enough free GPUs.
func churnOps(w workload, n int, seed uint64, steps int) []churnOp {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b9))
	var ops []churnOp
	var open []int // ids holding GPUs, not yet freed
	used := 0
	for range steps {
		if len(open) > 0 && (rng.Float64() < w.freeP || (w.drain && n-used <= 1)) {
			i := rng.IntN(len(open))
			ops = append(ops, churnOp{free: open[i]})
			used -= ops[open[i]].size
			open = append(open[:i], open[i+1:]...)
			continue
		}
		k := drawSize(rng, w.mix, n)
		full := k > n-used
		if !full {
			open = append(open, len(ops))
			used += k
		}
		ops = append(ops, churnOp{size: k, strict: rng.Float64() < w.strictP, full: full})
	}
	return ops
}

// playChurn runs a workload's steps through pick and counts the multi-GPU
// requests placed on their ideal class and the failures.
func playChurn(tb testing.TB, topo *topology.Topology, pick func(*NodeState, int) []int, w workload, seed uint64, steps int) churnStats {
	tb.Helper()
	return playChurnLive(tb, topo, func(n *NodeState, _ map[int]Result, k int) []int { return pick(n, k) }, w, seed, steps)
}

// playChurnLive is playChurn for a pick that also sees the running jobs
// (by the id of the step that placed them), as the online optimum, whose
// states are the running jobs, does (onlineShares).
func playChurnLive(tb testing.TB, topo *topology.Topology, pick func(*NodeState, map[int]Result, int) []int, w workload, seed uint64, steps int) churnStats {
	tb.Helper()
	ideal := idealClasses(topo)
	node := nodeWith("node-a", topo)
	live := map[int]Result{}
	var st churnStats
	for id, o := range churnOps(w, topo.Len(), seed, steps) {
		if o.size == 0 {
			if r, ok := live[o.free]; ok {
				if err := node.Release(Request{GPUs: len(r.GPUs)}, r); err != nil {
					tb.Fatal(err)
				}
				delete(live, o.free)
			}
			continue
		}
		k := o.size
		if k >= 2 {
			st.multi++
		}
		if o.full {
			st.failed++
			continue
		}
		set := pick(node, live, k)
		if len(set) != k {
			tb.Fatalf("no %d GPUs with %d free", k, node.FreeGPUs())
		}
		r := Result{Node: "node-a", GPUs: set, WeakestLink: setKey(topo, maskOf(set)).link()}
		if o.strict && k >= 2 && r.WeakestLink < ideal[k] {
			st.stranded++
			continue
		}
		if k >= 2 {
			st.placed++
			if r.WeakestLink >= ideal[k] {
				st.ideal++
			}
		}
		if err := node.Commit(Request{GPUs: k}, r); err != nil {
			tb.Fatal(err)
		}
		live[id] = r
	}
	return st
}

// maskOf is a set of positions as a bit mask.
func maskOf(set []int) uint64 {
	var m uint64
	for _, p := range set {
		m |= 1 << p
	}
	return m
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
				tot[i].stranded += s.stranded
			}
		}
	}
	return tot
}

// BenchmarkChurn prints, per topology, the share of multi-GPU requests
// placed on their ideal link class (over all multi-GPU requests, failed
// ones included), the requests that found too few free GPUs (failed) and
// those that found enough but none on the class they required (stranded),
// for gpulink and the three baselines, over every workload with fixed
// seeds: the figures are the same on every run.
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
				b.ReportMetric(float64(tot[i].stranded), a.name+"-stranded")
			}
		})
	}
}
