package gangbench

import (
	"fmt"
	"io"
	"strings"
)

// The paired report gives a mean and a standard error per comparison;
// telling a difference every seed shares from one that a few seeds carry
// (a wait 3 s longer on average: 4 seeds of 10 at 4-13 s, the others
// equal) needs the seeds themselves. `gpulink simulate --gang-trace
// --gang-per-seed FILE` writes them (WritePairedSeeds).

// PairedSeedsHeader is the first line of the per-seed log: tab-separated
// columns, one row per comparison, measure and seed.
const PairedSeedsHeader = "workload\tmode\tcluster\tload\tref\tbaseline\tmeasure\tseed\tref_value\tbaseline_value\tdifference"

// WritePairedSeeds writes the per-seed values behind WritePaired's
// comparisons of ref against each other row of the same workload, mode,
// cluster and load but those in skip: one row per measure and seed both
// ran with the measure defined.
func WritePairedSeeds(w io.Writer, cells []*Cell, ref string, skip ...string) error {
	var b strings.Builder
	for _, comp := range comparisons(cells, ref, skip) {
		g, c := comp.ref, comp.other
		for _, m := range PairedMeasures {
			for _, p := range seedPairs(g, c, m) {
				fmt.Fprintf(&b, "%s\t%s\t%s\t%g\t%s\t%s\t%s\t%d\t%g\t%g\t%g\n",
					c.Workload, c.Mode, c.Cluster, c.Load, ref, c.Policy, m.Name, p.Seed, p.A, p.B, p.A-p.B)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
