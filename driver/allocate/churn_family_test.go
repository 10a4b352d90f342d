package allocate

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

// churnFamilies are the workload families the look-ahead is measured on,
// each over churnSeeds random sequences per topology. "1224-high" is the
// workload of issue 21: sizes 1, 2, 2, 4 (2 twice as often), a job ends
// on 45 % of steps or whenever at most one GPU is free, 60 steps. The
// others vary one thing at a time: load, length, pinned requests (a share
// of multi-GPU requests requires its ideal class and fails below it) and
// size mixes.
var churnFamilies = []workload{
	{name: "1224-high", mix: []float64{0, 1, 2, 0, 1}, freeP: 0.45, drain: true, steps: 60},
	{name: "1224-light", mix: []float64{0, 1, 2, 0, 1}, freeP: 0.6, drain: true, steps: 60},
	{name: "1224-long", mix: []float64{0, 1, 2, 0, 1}, freeP: 0.45, drain: true, steps: 300},
	{name: "1224-pinned", mix: []float64{0, 1, 2, 0, 1}, freeP: 0.45, strictP: 0.3, drain: true, steps: 60},
	{name: "pairs-high", mix: []float64{0, 1, 4}, freeP: 0.45, drain: true, steps: 100},
	{name: "small-high", mix: []float64{0, 6, 4, 1, 2}, freeP: 0.45, drain: true, steps: 100},
	{name: "pow2-high", mix: []float64{0, 3, 3, 0, 2, 0, 0, 0, 1}, freeP: 0.45, drain: true, steps: 100},
	{name: "odd-high", mix: []float64{0, 2, 1, 3, 0, 2}, freeP: 0.5, drain: true, steps: 100},
	{name: "uniform-1-8", mix: []float64{0, 1, 1, 1, 1, 1, 1, 1, 1}, freeP: 0.45, drain: true, steps: 100},
	{name: "large-pinned", mix: []float64{0, 1, 2, 0, 3, 0, 0, 0, 2}, freeP: 0.5, strictP: 0.3, drain: true, steps: 100},
}

// churnSeeds is the number of random sequences per family and topology.
const churnSeeds = 30

// churnNoiseSE is how many standard errors of the mean per-seed
// difference count as noise: gpulink is "below myopic" on a family only
// when its mean share is lower by more than that.
const churnNoiseSE = 2

// churnGoalLead is the lead over myopic the look-ahead aims at on the
// issue's family, on topologies where myopic and first fit differ.
const churnGoalLead = 0.02

// familyPolicies are the placement rules the family table compares:
// gpulink (told the family's size mix, as the controller learns it),
// myopic, the MAPA policies (baseline is first fit) and greedy growth.
func familyPolicies(w workload) []allocator {
	return []allocator{
		{"gpulink", gpulinkMix(w.sizeMix())},
		{"myopic", myopic},
		{"first-fit", firstFit},
		{"mapa-topo", mapaTopoAware},
		{"mapa-greedy", mapaGreedy},
		{"mapa-preserve", mapaPreserve},
		{"prim", greedyPrim},
	}
}

// seedShares plays seeds 1..churnSeeds of a family on one topology with
// pick and returns each sequence's ideal-class share of its multi-GPU
// requests (nil when the policy does not handle the topology).
func seedShares(tb testing.TB, nt namedTopology, a allocator, w workload) []float64 {
	tb.Helper()
	if strings.HasPrefix(a.name, "mapa-") && nt.topo.Len() > mapaMaxFree {
		return nil
	}
	out := make([]float64, churnSeeds)
	for s := range out {
		out[s] = playChurn(tb, nt.topo, a.pick, w, uint64(s+1), w.steps).share()
	}
	return out
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// pairedDiff is the mean of a[i]-b[i] and its standard error (the same
// seeds are the same requests and frees for every policy, so the
// difference per seed is what varies).
func pairedDiff(a, b []float64) (d, se float64) {
	diffs := make([]float64, len(a))
	for i := range a {
		diffs[i] = a[i] - b[i]
	}
	d = mean(diffs)
	var ss float64
	for _, x := range diffs {
		ss += (x - d) * (x - d)
	}
	n := float64(len(diffs))
	return d, math.Sqrt(ss/(n-1)) / math.Sqrt(n)
}

func sameShares(a, b []float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestChurnNeverWorseThanMyopic plays every family over churnSeeds seeds on
// every topology and checks that gpulink's mean ideal-class share is never
// below the myopic allocator's (best set now, no look-ahead) beyond noise:
// by more than churnNoiseSE standard errors of the mean per-seed
// difference. Single sequences may go either way: one better choice
// changes which GPUs later frees release.
func TestChurnNeverWorseThanMyopic(t *testing.T) {
	for _, nt := range churnTopologies(t) {
		t.Run(nt.name, func(t *testing.T) {
			t.Parallel()
			for _, w := range churnFamilies {
				pols := familyPolicies(w)
				g := seedShares(t, nt, pols[0], w)
				m := seedShares(t, nt, pols[1], w)
				if d, se := pairedDiff(g, m); d < -churnNoiseSE*se {
					t.Errorf("%s: gpulink's mean ideal-class share %.3f is %.3f below myopic's %.3f (noise: %.3f)",
						w.name, mean(g), -d, mean(m), churnNoiseSE*se)
				}
			}
		})
	}
}

// churnOptimumGap is how far below the most any online allocator can
// expect gpulink's expected share may be where the goal is out of reach.
const churnOptimumGap = 0.005

// TestChurnLeadOverMyopic checks the goal of issue 21 on its family
// ("1224-high"): on every topology where myopic and first fit differ,
// gpulink's mean ideal-class share is at least churnGoalLead above
// myopic's, or no online allocator can be. The most any online allocator
// can expect (expectedBound: the online optimum, the best policy that
// knows the family's distribution, solved exactly; on nodes too large
// for it an upper bound of it) must then lead myopic's expected share by
// less than churnGoalLead, and gpulink's expected share must be within
// churnOptimumGap of it. Under the race detector the nodes of more than
// onlineMaxGPUs GPUs (pcie-16's optimum, 17 s without it, the 32-GPU
// bound, a minute) are left to the run without it (Makefile: test-unit).
func TestChurnLeadOverMyopic(t *testing.T) {
	w := churnFamilies[0]
	pols := familyPolicies(w)
	for _, nt := range churnTopologies(t) {
		t.Run(nt.name, func(t *testing.T) {
			t.Parallel()
			m := seedShares(t, nt, pols[1], w)
			if sameShares(m, seedShares(t, nt, pols[2], w)) {
				t.Skip("myopic and first fit place alike")
			}
			g := seedShares(t, nt, pols[0], w)
			mg, mm := mean(g), mean(m)
			if mg >= mm+churnGoalLead {
				return
			}
			if raceEnabled && nt.topo.Len() > onlineMaxGPUs {
				t.Skipf("%s: lead %+.3f; the optimum or bound on %d GPUs is checked without the race detector", w.name, mg-mm, nt.topo.Len())
			}
			bound, exact, ok := expectedBound(nt.topo, w)
			if !ok {
				t.Fatalf("%s: gpulink %.3f, myopic %.3f: lead %.3f, want >= %.2f (and no bound to show it out of reach)", w.name, mg, mm, mg-mm, churnGoalLead)
			}
			best := bound / expectedRequests(nt.topo.Len(), w)
			em, emSE := expectedShareMC(t, nt.topo, w, pols[1].pick)
			eg, egSE := expectedShareMC(t, nt.topo, w, pols[0].pick)
			what := "the online optimum"
			if !exact {
				what = "a bound on the online optimum"
			}
			t.Logf("%s: lead %+.3f over 30 seeds; expected shares: %s %.4f, gpulink %.4f±%.4f, myopic %.4f±%.4f",
				w.name, mg-mm, what, best, eg, egSE, em, emSE)
			if best-em >= churnGoalLead {
				t.Errorf("%s: %s leads myopic by %.4f in expectation, so the goal of %.2f may be within reach, but gpulink leads by %.3f", w.name, what, best-em, churnGoalLead, mg-mm)
			}
			if eg < best-churnOptimumGap {
				t.Errorf("%s: gpulink's expected share %.4f is more than %.3f below %s's %.4f", w.name, eg, churnOptimumGap, what, best)
			}
		})
	}
}

// BenchmarkChurnFamilies prints the tables of docs/performance/churn.md:
// per family and topology every policy's mean ideal-class share over
// churnSeeds sequences and gpulink's lead over myopic with its noise
// (churnNoiseSE standard errors of the paired difference); on the issue's
// family the online optimum's share over the same seeds, and the expected
// shares and leads of the optimum (or its bound), gpulink and myopic
// (online_optimum_test.go, online_bound_test.go); the lead per family and
// topology; and each policy's mean over the topologies where myopic and
// first fit differ. The figures are the same on every run (about two
// minutes on two cores). CHURN_TABLE=path writes them there too.
func BenchmarkChurnFamilies(b *testing.B) {
	var sb strings.Builder
	for range b.N {
		sb.Reset()
		writeChurnTables(&sb, churnResults(b))
	}
	b.StopTimer()
	fmt.Print(sb.String())
	if p := os.Getenv("CHURN_TABLE"); p != "" {
		if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// churnCell is one family on one topology: the per-seed shares of every
// policy of familyPolicies (nil where a policy does not run) and, on the
// issue's family where myopic and first fit differ, the online optimum's
// (nil where it is not computed) and the expected shares.
type churnCell struct {
	family, topo string
	shares       [][]float64
	optimum      []float64
	expected     *expectedShares
}

// expectedShares are a topology's expected ideal-class shares on a
// family: the online optimum's, exact (or, where exact is false, the
// relaxed upper bound of it), and gpulink's and myopic's estimated from
// mcSeeds sequences, with their standard errors.
type expectedShares struct {
	optimum            float64
	exact              bool
	gpulink, gpulinkSE float64
	myopic, myopicSE   float64
}

func (c churnCell) differs() bool { return !sameShares(c.shares[1], c.shares[2]) }

func churnResults(tb testing.TB) []churnCell {
	var out []churnCell
	tops := churnTopologies(tb)
	for fi, w := range churnFamilies {
		for _, nt := range tops {
			c := churnCell{family: w.name, topo: nt.name}
			for _, a := range familyPolicies(w) {
				c.shares = append(c.shares, seedShares(tb, nt, a, w))
			}
			if fi == 0 && c.differs() {
				c.optimum = onlineShares(tb, nt.topo, w)
				if v, exact, ok := expectedBound(nt.topo, w); ok {
					e := &expectedShares{optimum: v / expectedRequests(nt.topo.Len(), w), exact: exact}
					e.gpulink, e.gpulinkSE = expectedShareMC(tb, nt.topo, w, familyPolicies(w)[0].pick)
					e.myopic, e.myopicSE = expectedShareMC(tb, nt.topo, w, myopic)
					c.expected = e
				}
			}
			out = append(out, c)
		}
	}
	return out
}

func fmtMean(xs []float64) string {
	if xs == nil {
		return "—"
	}
	return fmt.Sprintf("%.3f", mean(xs))
}

func writeChurnTables(sb *strings.Builder, cells []churnCell) {
	var names []string
	for _, a := range familyPolicies(churnFamilies[0]) {
		names = append(names, a.name)
	}
	fmt.Fprintf(sb, "\nIssue family %s: mean ideal-class share over %d seeds\n\n", churnFamilies[0].name, churnSeeds)
	fmt.Fprintf(sb, "| topology | %s | online optimum | lead | noise |\n|%s\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)+4))
	for _, c := range cells {
		if c.family != churnFamilies[0].name || !c.differs() {
			continue
		}
		row := []string{c.topo}
		for _, sh := range c.shares {
			row = append(row, fmtMean(sh))
		}
		d, se := pairedDiff(c.shares[0], c.shares[1])
		row = append(row, fmtMean(c.optimum), fmt.Sprintf("%+.3f", d), fmt.Sprintf("%.3f", churnNoiseSE*se))
		fmt.Fprintf(sb, "| %s |\n", strings.Join(row, " | "))
	}

	fmt.Fprintf(sb, "\nIssue family %s: expected shares (optimum exact, ≤: an upper bound of it; gpulink and myopic over %d sequences, ± one standard error)\n\n", churnFamilies[0].name, mcSeeds)
	fmt.Fprintf(sb, "| topology | online optimum | gpulink | myopic | optimum's lead | gpulink's lead |\n|---|---|---|---|---|---|\n")
	for _, c := range cells {
		if e := c.expected; e != nil {
			le := "≤ "
			if e.exact {
				le = ""
			}
			fmt.Fprintf(sb, "| %s | %s%.4f | %.4f ± %.4f | %.4f ± %.4f | %s%+.4f | %+.4f |\n",
				c.topo, le, e.optimum, e.gpulink, e.gpulinkSE, e.myopic, e.myopicSE, le, e.optimum-e.myopic, e.gpulink-e.myopic)
		}
	}

	var topos []string
	for _, c := range cells {
		if c.family == churnFamilies[0].name && c.differs() {
			topos = append(topos, c.topo)
		}
	}
	fmt.Fprintf(sb, "\nLead of gpulink over myopic (mean share difference; * below myopic beyond %d standard errors)\n\n", churnNoiseSE)
	fmt.Fprintf(sb, "| family | %s |\n|%s\n", strings.Join(topos, " | "), strings.Repeat("---|", len(topos)+1))
	for _, w := range churnFamilies {
		row := []string{w.name}
		for _, tp := range topos {
			for _, c := range cells {
				if c.family == w.name && c.topo == tp {
					d, se := pairedDiff(c.shares[0], c.shares[1])
					mark := ""
					if d < -churnNoiseSE*se {
						mark = "*"
					}
					row = append(row, fmt.Sprintf("%+.3f%s", d, mark))
				}
			}
		}
		fmt.Fprintf(sb, "| %s |\n", strings.Join(row, " | "))
	}

	fmt.Fprintf(sb, "\nMean share per policy over the topologies of at most %d GPUs where myopic and first fit differ\n\n", mapaMaxFree)
	fmt.Fprintf(sb, "| family | %s |\n|%s\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)+1))
	for _, w := range churnFamilies {
		row := []string{w.name}
		for i := range names {
			var all []float64
			for _, c := range cells {
				if c.family == w.name && c.differs() && !slices.ContainsFunc(c.shares, func(s []float64) bool { return s == nil }) {
					all = append(all, mean(c.shares[i]))
				}
			}
			row = append(row, fmtMean(all))
		}
		fmt.Fprintf(sb, "| %s |\n", strings.Join(row, " | "))
	}

	fmt.Fprintf(sb, "\nEvery family, topology and policy\n\n")
	fmt.Fprintf(sb, "| family | topology | %s | lead | noise |\n|%s\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)+4))
	for _, c := range cells {
		row := []string{c.family, c.topo}
		for _, sh := range c.shares {
			row = append(row, fmtMean(sh))
		}
		d, se := pairedDiff(c.shares[0], c.shares[1])
		row = append(row, fmt.Sprintf("%+.3f", d), fmt.Sprintf("%.3f", churnNoiseSE*se))
		fmt.Fprintf(sb, "| %s |\n", strings.Join(row, " | "))
	}
}
