package gangbench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Paired differences: a gpulink row against each baseline on the same
// seeds.
//
// Every policy of a cell replays the same jobs per seed (the same
// arrivals, draws and load), so the difference of one measure between two
// policies on one seed removes the seed's own luck, which dominates the
// spread over seeds (a run of large gangs arriving late, say). The report
// gives the mean of those per-seed differences and its standard error
// (the sd of the differences over √seeds), and calls a difference beyond
// noise only when |mean| > NoiseSE standard errors with at least
// MinPairedSeeds seeds: fewer seeds never support a claim either way.

// NoiseSE is how many standard errors of the paired mean a difference
// must exceed to be called ahead or behind.
const NoiseSE = 2

// MinPairedSeeds is the fewest seeds a paired difference is judged on.
const MinPairedSeeds = 10

// Verdict is a paired difference judged against noise.
type Verdict string

const (
	// Ahead: the reference row better beyond noise.
	Ahead Verdict = "ahead"
	// Behind: the reference row worse beyond noise.
	Behind Verdict = "behind"
	// Level: within noise, or too few seeds to tell.
	Level Verdict = ""
)

// Diff is a paired difference, a reference row minus a baseline, over N
// seeds.
type Diff struct {
	Mean, SE float64
	N        int
	Verdict  Verdict
}

// PairedMeasure is a measure of the paired report and its direction.
type PairedMeasure struct {
	Name string
	Of   func(r *Result) float64
	// LowerBetter: waits and GPUs held idle.
	LowerBetter bool
}

// PairedMeasures are the measures the paired report compares.
var PairedMeasures = []PairedMeasure{
	{Name: "gangs placed %", Of: PlacedPct},
	{Name: "on minimal level %", Of: MinimalPct},
	{Name: "GPUs held idle avg", Of: HeldIdle, LowerBetter: true},
	{Name: "gang wait s", Of: WaitGangs, LowerBetter: true},
	{Name: "job wait s", Of: WaitAll, LowerBetter: true},
	{Name: "GPU utilisation %", Of: UtilPct},
}

// Paired is m's per-seed difference a − b over the seeds both cells ran
// (matched by Result.Seed; a seed where either is undefined, such as the
// minimal share with no gang placed, is left out), judged by NoiseSE and
// MinPairedSeeds.
func Paired(a, b *Cell, m PairedMeasure) Diff {
	pairs := seedPairs(a, b, m)
	ds := make([]float64, len(pairs))
	for i, p := range pairs {
		ds[i] = p.A - p.B
	}
	d := Diff{N: len(ds)}
	if d.N == 0 {
		d.Mean, d.SE = math.NaN(), math.NaN()
		return d
	}
	s := stat(ds)
	d.Mean = s.Mean
	if d.N > 1 {
		d.SE = s.SD / math.Sqrt(float64(d.N))
	}
	if d.N >= MinPairedSeeds && d.Mean != 0 && math.Abs(d.Mean) > NoiseSE*d.SE {
		better := d.Mean > 0 != m.LowerBetter
		d.Verdict = Behind
		if better {
			d.Verdict = Ahead
		}
	}
	return d
}

// seedPair is one measure of two cells on one seed.
type seedPair struct {
	Seed uint64
	A, B float64
}

// seedPairs are m of a and b on the seeds both ran, in a's order,
// matched by Result.Seed; a seed where either is undefined is left out.
func seedPairs(a, b *Cell, m PairedMeasure) []seedPair {
	bySeed := make(map[uint64]float64, len(b.Runs))
	for i := range b.Runs {
		bySeed[b.Runs[i].Seed] = m.Of(&b.Runs[i])
	}
	var out []seedPair
	for i := range a.Runs {
		y, ok := bySeed[a.Runs[i].Seed]
		x := m.Of(&a.Runs[i])
		if !ok || math.IsNaN(x) || math.IsNaN(y) {
			continue
		}
		out = append(out, seedPair{Seed: a.Runs[i].Seed, A: x, B: y})
	}
	return out
}

// comparison is a ref row and another row of the same workload, mode,
// cluster and load.
type comparison struct{ ref, other *Cell }

// comparisons pairs each cell but ref's and those in skip with ref's
// cell of the same workload, mode, cluster and load, in cells' order;
// a cell without one is left out.
func comparisons(cells []*Cell, ref string, skip []string) []comparison {
	type key struct {
		wl, mode, cluster string
		load              float64
	}
	refs := map[key]*Cell{}
	for _, c := range cells {
		if c.Policy == ref {
			refs[key{c.Workload, c.Mode, c.Cluster, c.Load}] = c
		}
	}
	var out []comparison
	for _, c := range cells {
		g := refs[key{c.Workload, c.Mode, c.Cluster, c.Load}]
		if g == nil || c.Policy == ref || slices.Contains(skip, c.Policy) {
			continue
		}
		out = append(out, comparison{ref: g, other: c})
	}
	return out
}

// WritePaired writes, per workload and mode, the paired difference of the
// ref policy's row against each other row of the same cluster and load
// but those in skip, mean ± standard error, with "ahead" or "behind" where
// it is beyond noise (NoiseSE, MinPairedSeeds). Cells without a ref run of
// the same (workload, mode, cluster, load) are skipped.
func WritePaired(w io.Writer, cells []*Cell, ref string, skip ...string) error {
	var b strings.Builder
	group := ""
	for _, comp := range comparisons(cells, ref, skip) {
		g, c := comp.ref, comp.other
		if name := c.Workload + ", " + c.Mode; name != group {
			if group != "" {
				b.WriteString("\n")
			}
			group = name
			fmt.Fprintf(&b, "### %s − baseline: %s (%d seeds)\n\n", ref, name, len(g.Runs))
			b.WriteString("| cluster | load | baseline |")
			for _, m := range PairedMeasures {
				b.WriteString(" " + m.Name + " |")
			}
			b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(PairedMeasures)) + "\n")
		}
		fmt.Fprintf(&b, "| %s | %.1f | %s |", c.Cluster, c.Load, c.Policy)
		for _, m := range PairedMeasures {
			b.WriteString(" " + fmtDiff(Paired(g, c, m)) + " |")
		}
		b.WriteString("\n")
	}
	if group != "" {
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtDiff(d Diff) string {
	if math.IsNaN(d.Mean) {
		return "–"
	}
	var s string
	switch m := math.Abs(d.Mean); {
	case m >= 100:
		s = fmt.Sprintf("%+.0f ± %.0f", d.Mean, d.SE)
	case m > 0 && m < 0.1:
		// Small but maybe beyond noise (every seed alike): show it.
		s = fmt.Sprintf("%+.2f ± %.2f", d.Mean, d.SE)
	default:
		s = fmt.Sprintf("%+.1f ± %.1f", d.Mean, d.SE)
	}
	if d.Verdict != Level {
		s += " **" + string(d.Verdict) + "**"
	}
	return s
}
