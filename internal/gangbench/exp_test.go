package gangbench

import (
	"os"
	"strings"
	"testing"
)

func TestExperiment(t *testing.T) {
	if os.Getenv("GANG_EXP") == "" {
		t.Skip("GANG_EXP unset")
	}
	wls := strings.Split(os.Getenv("GANG_EXP"), ",")
	run := func(name string, pols []string, hist int) {
		cells, err := Run(Config{Dir: "../../../shared/traces/gangs", Workloads: wls, SpotJobs: 3000, Clusters: []string{"superpod", "nvl72"}, Nodes: 2048,
			Loads: []float64{2, 3}, Modes: []string{"required", "preferred"}, Policies: pols, Seeds: []uint64{1, 2, 3, 4}, Workers: 2, Options: Options{History: hist}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cells {
			t.Logf("%-8s %s %s %s %.0f %-10s placed %5.1f±%.1f minimal %5.1f±%.1f util %.2f±%.2f waitG %.0f", name, c.Workload, c.Mode, c.Cluster, c.Load, c.Policy, c.Measure(PlacedPct).Mean, c.Measure(PlacedPct).SD, c.Measure(MinimalPct).Mean, c.Measure(MinimalPct).SD, c.Measure(UtilPct).Mean, c.Measure(UtilPct).SD, c.Measure(WaitGangs).Mean)
		}
	}
	run("demand", []string{PolicyGPULink, PolicyKueue}, 0)
	run("nodemand", []string{PolicyGPULink}, -1)
}
