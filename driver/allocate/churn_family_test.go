package allocate

import (
	"fmt"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
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

// churnLeadOut are the topologies where gpulink's lead over myopic on the
// issue's family stays below churnGoalLead although myopic and first fit
// differ, with why. On those of at most rolloutMaxGPUs GPUs the rollout
// reference (an online look-ahead that knows the family's exact
// distribution and simulates 40 futures of 25 steps for every candidate
// set, BenchmarkChurnFamilies) leads myopic by no more than 0.02 either
// and is within 0.003 of gpulink: the lead is not there for an online
// allocator to take (docs/performance/churn.md).
var churnLeadOut = map[string]string{
	"p40-pcie-7":             "one ideal quad (a switch) and two switches: myopic's lowest positions already keep it; rollout below myopic too",
	"pcie-4":                 "two PIX pairs: rollout, gpulink and myopic place alike",
	"workstation-4-nvbridge": "two bridged pairs: rollout, gpulink and myopic place alike",
	"pcie-switch-8":          "rollout at gpulink's share",
	"pcie-pex-8":             "rollout at gpulink's share",
	"dgx1-p100":              "rollout at gpulink's share",
	"dgx1-v100":              "rollout at gpulink's share",
	"pcie-16":                "16 GPUs: no rollout reference (too many candidate sets)",
	"nvlink-tiered-32":       "32 GPUs in one NVLink component: searched by the beam (doc.go), which does not weigh criterion 3d",
}

// TestChurnLeadOverMyopic checks the goal of issue 21 on its family
// ("1224-high"): on every topology where myopic and first fit differ,
// gpulink's mean ideal-class share is at least churnGoalLead above
// myopic's, except on the topologies of churnLeadOut, where the lead is
// reported (and TestChurnNeverWorseThanMyopic keeps it from turning
// negative beyond noise).
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
			if why, ok := churnLeadOut[nt.name]; ok {
				t.Logf("%s: gpulink %.3f, myopic %.3f: lead %+.3f (goal %.2f not reached: %s)", w.name, mg, mm, mg-mm, churnGoalLead, why)
				return
			}
			if mg < mm+churnGoalLead {
				t.Errorf("%s: gpulink %.3f, myopic %.3f: lead %.3f, want >= %.2f", w.name, mg, mm, mg-mm, churnGoalLead)
			}
		})
	}
}

// rolloutMaxGPUs bounds the nodes the rollout reference runs on: it
// simulates futures for every candidate set.
const rolloutMaxGPUs = 10

// rolloutShares is the rollout reference on seeds 1..churnSeeds: an online
// policy that knows the family's distribution (sizes, end probability,
// drain), not its sequence. For every candidate set it simulates samples
// random futures of horizon steps from the state after the placement,
// gpulink placing the requests to come, and takes the set whose futures
// (its own placement included) put the most multi-GPU requests on their
// ideal class, gpulink's set on a tie. It is a yardstick of what an online
// look-ahead can gain over gpulink, not a policy: it costs milliseconds a
// decision. nil on nodes of more than rolloutMaxGPUs GPUs.
func rolloutShares(tb testing.TB, topo *topology.Topology, w workload, samples, horizon int) []float64 {
	tb.Helper()
	if topo.Len() > rolloutMaxGPUs {
		return nil
	}
	ideal := idealClasses(topo)
	g := gpulinkMix(w.sizeMix())
	out := make([]float64, churnSeeds)
	for seed := range out {
		out[seed] = playChurnLive(tb, topo, func(n *NodeState, live map[int]Result, k int) []int {
			return positions(rolloutPick(tb, n, live, w, ideal, g, k, samples, horizon))
		}, w, uint64(seed+1), w.steps).share()
	}
	return out
}

func rolloutPick(tb testing.TB, node *NodeState, live map[int]Result, w workload, ideal []topology.Link,
	g func(*NodeState, int) []int, k, samples, horizon int) uint64 {
	topo := node.Topology
	var gm uint64
	for _, p := range g(node, k) {
		gm |= 1 << p
	}
	free := freeMask(node)
	best, bestV := gm, -1
	try := func(set uint64) {
		r := Result{Node: "node-a", GPUs: positions(set), WeakestLink: setKey(topo, set).link()}
		v := 0
		if k >= 2 && r.WeakestLink >= ideal[k] {
			v = samples
		}
		after := &NodeState{Name: node.Name, Topology: topo, Usage: slices.Clone(node.Usage)}
		if err := after.Commit(Request{GPUs: k}, r); err != nil {
			tb.Fatal(err)
		}
		open := []Result{r}
		for _, id := range slices.Sorted(maps.Keys(live)) {
			open = append(open, live[id])
		}
		for s := range samples {
			v += rolloutFuture(tb, after, open, w, ideal, g, rand.New(rand.NewPCG(uint64(s), 77)), horizon)
		}
		if v > bestV {
			best, bestV = set, v
		}
	}
	try(gm)
	for s := free; s != 0; s = (s - 1) & free {
		if bits.OnesCount64(s) == k && s != gm {
			try(s)
		}
	}
	return best
}

// rolloutFuture plays one random future from node (not changed) with the
// allocations open, and counts the multi-GPU requests gpulink puts on
// their ideal class.
func rolloutFuture(tb testing.TB, node *NodeState, open []Result, w workload, ideal []topology.Link,
	g func(*NodeState, int) []int, rng *rand.Rand, horizon int) int {
	n := &NodeState{Name: node.Name, Topology: node.Topology, Usage: slices.Clone(node.Usage)}
	open = slices.Clone(open)
	got := 0
	for range horizon {
		if len(open) > 0 && (rng.Float64() < w.freeP || (w.drain && n.FreeGPUs() <= 1)) {
			i := rng.IntN(len(open))
			if err := n.Release(Request{GPUs: len(open[i].GPUs)}, open[i]); err != nil {
				tb.Fatal(err)
			}
			open = slices.Delete(open, i, i+1)
			continue
		}
		k := drawSize(rng, w.mix, n.Topology.Len())
		if k > n.FreeGPUs() {
			continue
		}
		set := g(n, k)
		var mask uint64
		for _, p := range set {
			mask |= 1 << p
		}
		r := Result{Node: "node-a", GPUs: set, WeakestLink: setKey(n.Topology, mask).link()}
		if k >= 2 && r.WeakestLink >= ideal[k] {
			got++
		}
		if err := n.Commit(Request{GPUs: k}, r); err != nil {
			tb.Fatal(err)
		}
		open = append(open, r)
	}
	return got
}

// BenchmarkChurnFamilies prints the tables of docs/performance/churn.md:
// per family and topology every policy's mean ideal-class share over
// churnSeeds sequences and gpulink's lead over myopic with its noise
// (churnNoiseSE standard errors of the paired difference); the rollout
// reference on the family; the lead per family and topology; and
// each policy's mean over the topologies where myopic and first fit
// differ. The figures are the same on every run (three to four minutes on
// two cores). CHURN_TABLE=path writes them there too.
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
// policy of familyPolicies (nil where a policy does not run), and of the
// rollout reference (issue family, small nodes only).
type churnCell struct {
	family, topo string
	shares       [][]float64
	rollout      []float64
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
				c.rollout = rolloutShares(tb, nt.topo, w, 40, 25)
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
	fmt.Fprintf(sb, "| topology | %s | rollout | lead | noise |\n|%s\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)+4))
	for _, c := range cells {
		if c.family != churnFamilies[0].name || !c.differs() {
			continue
		}
		row := []string{c.topo}
		for _, sh := range c.shares {
			row = append(row, fmtMean(sh))
		}
		d, se := pairedDiff(c.shares[0], c.shares[1])
		row = append(row, fmtMean(c.rollout), fmt.Sprintf("%+.3f", d), fmt.Sprintf("%.3f", churnNoiseSE*se))
		fmt.Fprintf(sb, "| %s |\n", strings.Join(row, " | "))
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
