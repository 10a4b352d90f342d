package gangbench

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// The per-seed log holds the values behind each paired difference: one
// row per measure and seed, matched by seed, the skipped rows and cells
// without a reference row left out, and the mean of its differences is
// Paired's mean.
func TestWritePairedSeeds(t *testing.T) {
	run := func(seed uint64, placed int, wait float64) Result {
		return Result{Seed: seed, Gangs: 10, GangsPlaced: placed, GangsMinimal: placed, WaitGangs: wait, WaitAll: wait}
	}
	ref := &Cell{Workload: "kalos", Mode: ModePreferred, Cluster: "superpod", Load: 2, Policy: PolicyGPULink,
		Runs: []Result{run(1, 9, 100), run(2, 8, 130)}}
	// The baseline's runs in the other order: matched by seed.
	base := &Cell{Workload: "kalos", Mode: ModePreferred, Cluster: "superpod", Load: 2, Policy: PolicyKueue,
		Runs: []Result{run(2, 8, 120), run(1, 7, 90)}}
	skipped := &Cell{Workload: "kalos", Mode: ModePreferred, Cluster: "superpod", Load: 2, Policy: PolicyGPULinkReserving, Runs: base.Runs}
	alone := &Cell{Workload: "kalos", Mode: ModePreferred, Cluster: "superpod", Load: 3, Policy: PolicyKueue, Runs: base.Runs}
	var out strings.Builder
	if err := WritePairedSeeds(&out, []*Cell{ref, base, skipped, alone}, PolicyGPULink, PolicyGPULinkReserving); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(PairedMeasures)*2 {
		t.Fatalf("%d lines, want %d measures × 2 seeds of the one comparison:\n%s", len(lines), len(PairedMeasures), out.String())
	}
	cols := len(strings.Split(PairedSeedsHeader, "\t"))
	sums := map[string]float64{}
	for _, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != cols || f[4] != PolicyGPULink || f[5] != PolicyKueue || f[3] != "2" {
			t.Fatalf("line %q: want %d columns, %s against %s at load 2", l, cols, PolicyGPULink, PolicyKueue)
		}
		a, _ := strconv.ParseFloat(f[8], 64)
		b, _ := strconv.ParseFloat(f[9], 64)
		d, _ := strconv.ParseFloat(f[10], 64)
		if d != a-b {
			t.Errorf("line %q: difference %g, want %g", l, d, a-b)
		}
		if f[6] == "gang wait s" && (f[7] == "1" && d != 10 || f[7] == "2" && d != 10) {
			t.Errorf("line %q: gang wait differs by 10 s on both seeds", l)
		}
		sums[f[6]] += d
	}
	for _, m := range PairedMeasures {
		if want := Paired(ref, base, m).Mean; math.Abs(sums[m.Name]/2-want) > 1e-9 {
			t.Errorf("%s: mean of the rows %g, Paired %g", m.Name, sums[m.Name]/2, want)
		}
	}
}
