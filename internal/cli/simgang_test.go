package cli

import (
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/internal/gangbench"
)

func TestSimulateGangTraceFlags(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantStderr string
	}{
		{"no trace names the file", []string{"simulate", "--gang-trace", t.TempDir()}, "kalos_jobs.csv"},
		{"seeds at least 1", []string{"simulate", "--gang-trace", t.TempDir(), "--gang-seeds", "0"}, "--gang-seeds must be at least 1"},
		{"starvation bound positive", []string{"simulate", "--gang-trace", t.TempDir(), "--gang-starvation-bound", "0s"}, "--gang-starvation-bound must be positive, got 0s"},
		{"preferred starvation bound positive", []string{"simulate", "--gang-trace", t.TempDir(), "--gang-preferred-starvation-bound", "0s"}, "--gang-preferred-starvation-bound must be positive, got 0s"},
		{"strict reservation bound not negative", []string{"simulate", "--gang-trace", t.TempDir(), "--gang-strict-reservation-bound", "-1s"}, "--gang-strict-reservation-bound must be 0 or more, got -1s"},
		{"excludes a scenario", []string{"simulate", "--gang-trace", t.TempDir(), "--scenario", "x.yaml"}, "--gang-trace excludes --scenario and --trace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, code := runCLI(t, tt.args...)
			if code == 0 || !strings.Contains(stderr, tt.wantStderr) {
				t.Fatalf("exit %d, stderr %q; want a failure naming %q", code, stderr, tt.wantStderr)
			}
		})
	}
}

// TestSimulateGangTraceRuns replays a few jobs written here (not the
// shared trace) on one small cluster: the report has a row per policy.
func TestSimulateGangTraceRuns(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "kalos_jobs.csv", "job_id,submit_time_s,duration_s,num_pods,gpus_per_pod\n0,0,100,4,8\n1,10,50,1,2\n2,20,80,40,8\n3,30,10,2,8\n")
	stdout, stderr, code := runCLI(t, "simulate", "--gang-trace", dir, "--gang-workloads", "kalos", "--gang-clusters", "superpod",
		"--gang-nodes", "64", "--gang-loads", "1", "--gang-seeds", "1", "--gang-modes", "required", "--gang-workers", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"### kalos, required (1 seeds)", "| superpod | 1.0 | gpulink |", "| superpod | 1.0 | per-pod-greedy |", "superpod: 64 8-GPU nodes", "### gpulink − baseline: kalos, required (1 seeds)", "| superpod | 1.0 | kueue-tas |",
		"| superpod | 1.0 | gpulink:starvationBound |", "gpulink:starvationBound: gpulink with the controller's starvation reservation: of the gangs waiting longer than 15m0s (under required; 4h0m0s under preferred), the one of the highest level", "until the holder has waited 8h0m0s, a job that fits nowhere else may still use the domain",
		"## The chart's default against the baselines", "### gpulink:starvationBound − baseline: kalos, required (1 seeds)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
}

// TestSimulateGangTracePerSeed: --gang-per-seed writes the values behind
// both paired reports (gpulink against every other row; the chart's
// default row against the baselines, not against gpulink), each row's
// difference its two values' difference; a path that cannot be created
// is refused with the flag named, before anything is replayed.
func TestSimulateGangTracePerSeed(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "kalos_jobs.csv", "job_id,submit_time_s,duration_s,num_pods,gpus_per_pod\n0,0,100,4,8\n1,10,50,1,2\n2,20,80,40,8\n3,30,10,2,8\n")
	perSeed := filepath.Join(t.TempDir(), "seeds.tsv")
	args := []string{"simulate", "--gang-trace", dir, "--gang-workloads", "kalos", "--gang-clusters", "superpod",
		"--gang-nodes", "64", "--gang-loads", "1", "--gang-seeds", "2", "--gang-modes", "required", "--gang-workers", "1",
		"--gang-policies", "gpulink,gpulink:starvationBound,kueue-tas"}
	_, stderr, code := runCLI(t, append(args, "--gang-per-seed", perSeed)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	pairs := map[string]int{}
	for _, l := range readTSV(t, perSeed, gangbench.PairedSeedsHeader) {
		f := strings.Split(l, "\t")
		if len(f) != 11 {
			t.Fatalf("line %q: %d columns, want 11", l, len(f))
		}
		a, errA := strconv.ParseFloat(f[8], 64)
		b, errB := strconv.ParseFloat(f[9], 64)
		d, errD := strconv.ParseFloat(f[10], 64)
		if errA != nil || errB != nil || errD != nil || d != a-b {
			t.Errorf("line %q: difference is not ref minus baseline", l)
		}
		pairs[f[4]+" - "+f[5]]++
	}
	// Every measure is defined here (gangs are placed on both seeds): 6
	// measures × 2 seeds per comparison.
	want := map[string]int{"gpulink - gpulink:starvationBound": 12, "gpulink - kueue-tas": 12, "gpulink:starvationBound - kueue-tas": 12}
	if !maps.Equal(pairs, want) {
		t.Errorf("rows per comparison %v, want %v", pairs, want)
	}

	_, stderr, code = runCLI(t, append(args, "--gang-per-seed", filepath.Join(t.TempDir(), "missing", "seeds.tsv"))...)
	if code == 0 || !strings.Contains(stderr, "--gang-per-seed") || !strings.Contains(stderr, "missing") {
		t.Errorf("a path in a missing directory: exit %d, %q; want an error naming --gang-per-seed and the path", code, stderr)
	}
}
