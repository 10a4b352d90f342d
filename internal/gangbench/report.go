package gangbench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// WriteMarkdown writes one table per workload and mode: per cluster, load
// and policy, the gangs placed, the share of them on their minimal level,
// the GPUs held idle by partly placed gangs, the queueing delays and the
// GPU utilisation, as mean ± sd over seeds.
func WriteMarkdown(w io.Writer, cells []*Cell) error {
	var b strings.Builder
	type key struct{ wl, mode string }
	var order []key
	groups := map[key][]*Cell{}
	for _, c := range cells {
		k := key{c.Workload, c.Mode}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], c)
	}
	for _, k := range order {
		cs := groups[k]
		fmt.Fprintf(&b, "### %s, %s (%d seeds)\n\n", k.wl, k.mode, len(cs[0].Runs))
		r := cs[0].Runs[0]
		fmt.Fprintf(&b, "%d jobs per seed, %d of them gangs (several pods).\n\n", r.Jobs, r.Gangs)
		b.WriteString("| cluster | load | policy | gangs placed % | on minimal level % | GPUs held idle (avg / peak) | gang wait s | job wait s | GPU utilisation % |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
		for _, c := range cs {
			fmt.Fprintf(&b, "| %s | %.1f | %s | %s | %s | %s / %s | %s | %s | %s |\n", c.Cluster, c.Load, c.Policy,
				f1(c.Measure(PlacedPct)), f1(c.Measure(MinimalPct)), f0(c.Measure(HeldIdle)), f0(c.Measure(HeldPeak)),
				f0(c.Measure(WaitGangs)), f0(c.Measure(WaitAll)), f1(c.Measure(UtilPct)))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func f1(s Stat) string {
	if math.IsNaN(s.Mean) {
		return "–"
	}
	return fmt.Sprintf("%.1f ± %.1f", s.Mean, s.SD)
}

func f0(s Stat) string {
	if math.IsNaN(s.Mean) {
		return "–"
	}
	return fmt.Sprintf("%.0f ± %.0f", s.Mean, s.SD)
}
