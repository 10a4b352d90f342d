package mig_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gpulink/gpulink/driver/mig"
)

// MIG churn: requests of mixed profiles arrive on one 8-GPU node, one per
// step, and each leaves after an exponentially distributed lifetime. The
// loads keep the node near full or over full (churnLoads): what a policy
// places then depends on how it fragments the GPUs. A request that finds no
// placement is refused (it does not wait), which is what the share of
// requests placed counts.

// churnMix is the request mix of one GPU model: profile names and weights.
type churnMix struct {
	server   string
	profiles []string
	weights  []float64
}

var churnMixes = []churnMix{
	{"dgxa100", []string{"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}, []float64{0.35, 0.1, 0.2, 0.15, 0.1, 0.1}},
	{"dgxh100", []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}, []float64{0.35, 0.1, 0.2, 0.15, 0.1, 0.1}},
}

const churnGPUs = 8

// churnLoads are the mean lifetimes (in steps, one arrival per step) the
// benchmark runs: about 20 keeps the node near full, 30 over full.
var churnLoads = []float64{20, 30}

// churnResult is one churn run: requests and placements, in all and of
// the large profiles (4g and up), and each decision's time.
type churnResult struct {
	requests, placed           int
	largeRequests, largePlaced int
	times                      []time.Duration
}

type live struct {
	end  float64
	gpu  int
	part mig.Part
}

// runChurn runs steps arrivals of mix on an 8-GPU node under policy.
func runChurn(tb testing.TB, mix churnMix, policy mig.Policy, lifetime float64, seed uint64, steps int, timed bool) churnResult {
	tab, _ := mockTable(tb, mix.server)
	gpus := make([]mig.GPUState, churnGPUs)
	for g := range gpus {
		gpus[g] = mig.GPUState{Index: g, Table: tab}
	}
	byProfile := map[string][]mig.Candidate{}
	for _, name := range mix.profiles {
		byProfile[name] = candidates(gpus, name)
		if len(byProfile[name]) == 0 {
			tb.Fatalf("%s has no profile %s", mix.server, name)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d6967))
	var res churnResult
	var running []live
	for step := range steps {
		now := float64(step)
		kept := running[:0]
		for _, l := range running {
			if l.end <= now {
				gpus[l.gpu].State = tab.Remove(gpus[l.gpu].State, l.part)
				continue
			}
			kept = append(kept, l)
		}
		running = kept
		name := pick(rng, mix)
		large := tab.Profiles[byProfile[name][0].Part.Profile].ComputeSlices >= 4
		res.requests++
		if large {
			res.largeRequests++
		}
		var start time.Time
		if timed {
			start = time.Now()
		}
		ch, ok := mig.Choose(policy, gpus, byProfile[name])
		if timed {
			res.times = append(res.times, time.Since(start))
		}
		if !ok {
			continue
		}
		res.placed++
		if large {
			res.largePlaced++
		}
		c := ch.Candidate
		gpus[c.GPU].State = tab.Add(gpus[c.GPU].State, c.Part)
		running = append(running, live{end: now + rng.ExpFloat64()*lifetime, gpu: c.GPU, part: c.Part})
	}
	return res
}

func pick(rng *rand.Rand, mix churnMix) string {
	x := rng.Float64()
	for i, w := range mix.weights {
		if x < w {
			return mix.profiles[i]
		}
		x -= w
	}
	return mix.profiles[len(mix.profiles)-1]
}

// meanShares runs seeds churn runs and returns the mean share of requests
// placed, of all and of the large ones.
func meanShares(tb testing.TB, mix churnMix, policy mig.Policy, lifetime float64, seeds, steps int) (all, large float64) {
	for s := range seeds {
		r := runChurn(tb, mix, policy, lifetime, uint64(s+1), steps, false)
		all += float64(r.placed) / float64(r.requests)
		large += float64(r.largePlaced) / float64(max(r.largeRequests, 1))
	}
	return all / float64(seeds), large / float64(seeds)
}

// Over the same request sequences (30 seeds), look-ahead places at least
// as many requests as first fit, on average, on A100 and H100 nodes.
func TestChurnLookAheadPlacesAtLeastFirstFit(t *testing.T) {
	const seeds, steps = 30, 600
	for _, mix := range churnMixes {
		const lifetime = 30
		la, laLarge := meanShares(t, mix, mig.LookAhead, lifetime, seeds, steps)
		ff, ffLarge := meanShares(t, mix, mig.FirstFit, lifetime, seeds, steps)
		bf, bfLarge := meanShares(t, mix, mig.BestFit, lifetime, seeds, steps)
		t.Logf("%s: placed %.1f%% look-ahead, %.1f%% first fit, %.1f%% best fit; 4g and up %.1f%%, %.1f%%, %.1f%%",
			mix.server, 100*la, 100*ff, 100*bf, 100*laLarge, 100*ffLarge, 100*bfLarge)
		if la < ff {
			t.Errorf("%s: look-ahead placed %.2f%% of requests, first fit %.2f%%", mix.server, 100*la, 100*ff)
		}
		if la == 1 {
			t.Errorf("%s: every request placed under look-ahead; the load does not test placement", mix.server)
		}
	}
}

// BenchmarkMIGChurn is the churn above on 8-GPU A100 and H100 nodes per
// policy: share of requests placed (all, and 4g and larger) as the mean
// over 30 seeds, and each decision's time (p50 and p99 over all
// decisions; the target is p50 < 50µs per node).
func BenchmarkMIGChurn(b *testing.B) {
	const seeds, steps = 30, 2000
	for _, mix := range churnMixes {
		for _, lifetime := range churnLoads {
			for _, policy := range []mig.Policy{mig.LookAhead, mig.FirstFit, mig.BestFit} {
				b.Run(fmt.Sprintf("%s/lifetime-%.0f/%s", mix.server, lifetime, policy), func(b *testing.B) {
					var all, large float64
					var times []time.Duration
					for range b.N {
						all, large = 0, 0
						times = times[:0]
						for s := range seeds {
							r := runChurn(b, mix, policy, lifetime, uint64(s+1), steps, true)
							all += float64(r.placed) / float64(r.requests)
							large += float64(r.largePlaced) / float64(max(r.largeRequests, 1))
							times = append(times, r.times...)
						}
					}
					slices.Sort(times)
					b.ReportMetric(100*all/seeds, "placed-%")
					b.ReportMetric(100*large/seeds, "placed-4g+-%")
					b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns/decision")
					b.ReportMetric(float64(times[int(math.Min(float64(len(times)-1), float64(len(times))*0.99))].Nanoseconds()), "p99-ns/decision")
				})
			}
		}
	}
}
