package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpulink/gpulink/internal/gangbench"
)

// gangFlags are `gpulink simulate --gang-trace`'s options: the replay of
// multi-node jobs (internal/gangbench, docs/performance/gangs.md).
type gangFlags struct {
	dir       string
	workloads []string
	modes     []string
	clusters  []string
	nodes     int
	spotJobs  int
	loads     []float64
	policies  []string
	seeds     int
	markdown  string
	perSeed   string
	workers   int
	// starvation is the controller's --gang-starvation-bound for the
	// gpulink:starvationBound row.
	starvation time.Duration
	// preferred is its --gang-preferred-starvation-bound.
	preferred time.Duration
	strict    time.Duration
}

func (f *gangFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "gang-trace", "", "replay multi-node jobs (gangs) from this directory (kalos_jobs.csv) instead of a scenario")
	fl.StringSliceVar(&f.workloads, "gang-workloads", []string{gangbench.WorkloadKalos, gangbench.WorkloadSpot, gangbench.WorkloadMixed}, "with --gang-trace: kalos (the trace's jobs), spot (drawn from the spot trace's published distribution), mixed (both, half the GPU-seconds each)")
	fl.StringSliceVar(&f.modes, "gang-modes", []string{gangbench.ModePreferred, gangbench.ModeRequired}, "with --gang-trace: preferred (gangs as low as they fit) and/or required (each gang requires its minimal level)")
	fl.StringSliceVar(&f.clusters, "gang-clusters", []string{"superpod", "nvl72"}, "with --gang-trace: superpod (32-node leaves) and/or nvl72 (18-node NVLink cliques)")
	fl.IntVar(&f.nodes, "gang-nodes", 2048, "with --gang-trace: 8-GPU nodes per cluster (rounded up to whole leaves)")
	fl.IntVar(&f.spotJobs, "gang-spot-jobs", 2000, "with --gang-trace: jobs per seed of the spot workload")
	fl.Float64SliceVar(&f.loads, "gang-loads", []float64{1, 2, 3}, "with --gang-trace: offered loads (GPU-seconds arriving per window over the cluster's GPU-seconds)")
	fl.StringSliceVar(&f.policies, "gang-policies", gangbench.AllPolicies, "with --gang-trace: policies to replay")
	fl.IntVar(&f.seeds, "gang-seeds", 3, "with --gang-trace: seeds 1..N (arrival jitter, spot draws, the baselines' random choices)")
	fl.StringVar(&f.markdown, "gang-markdown", "", "with --gang-trace: also write the report to this file")
	fl.StringVar(&f.perSeed, "gang-per-seed", "", "with --gang-trace: also write the per-seed values behind every paired difference to this file (tab-separated)")
	fl.IntVar(&f.workers, "gang-workers", runtime.GOMAXPROCS(0), "with --gang-trace: replays run in parallel")
	fl.DurationVar(&f.starvation, "gang-starvation-bound", gangbench.DefaultStarvationBound*time.Second, "with --gang-trace: the controller's --gang-starvation-bound for the gpulink:starvationBound row (a gang waiting longer reserves the domain closest to fitting it)")
	fl.DurationVar(&f.preferred, "gang-preferred-starvation-bound", gangbench.DefaultPreferredStarvationBound*time.Second, "with --gang-trace: the controller's --gang-preferred-starvation-bound for the gpulink:starvationBound row (the bound of gangs whose level is only preferred: every gang under --gang-modes preferred)")
	fl.DurationVar(&f.strict, "gang-strict-reservation-bound", gangbench.DefaultStrictReservationBound*time.Second, "with --gang-trace: the controller's --gang-strict-reservation-bound for the gpulink:starvationBound row (until the holder has waited this long, a job that fits nowhere else may still use the reserved domain; 0: strict from the start)")
}

func (f *gangFlags) run(out io.Writer) (err error) {
	if f.seeds < 1 {
		return usageError{fmt.Errorf("--gang-seeds must be at least 1, got %d", f.seeds)}
	}
	if f.starvation <= 0 {
		return usageError{fmt.Errorf("--gang-starvation-bound must be positive, got %s (leave gpulink:starvationBound out of --gang-policies for no reservation)", f.starvation)}
	}
	if f.preferred <= 0 {
		return usageError{fmt.Errorf("--gang-preferred-starvation-bound must be positive, got %s", f.preferred)}
	}
	if f.strict < 0 {
		return usageError{fmt.Errorf("--gang-strict-reservation-bound must be 0 or more, got %s", f.strict)}
	}
	strict := f.strict.Seconds()
	if strict == 0 {
		strict = -1 // gangbench.Options: strict from the start
	}
	cfg := gangbench.Config{
		Dir: f.dir, Workloads: f.workloads, SpotJobs: f.spotJobs, Clusters: f.clusters, Nodes: f.nodes,
		Loads: f.loads, Modes: f.modes, Policies: f.policies, Workers: f.workers,
		Options: gangbench.Options{StarvationBound: f.starvation.Seconds(), PreferredStarvationBound: f.preferred.Seconds(), StrictReservationBound: strict},
	}
	for s := 1; s <= f.seeds; s++ {
		cfg.Seeds = append(cfg.Seeds, uint64(s))
	}
	// Created before the replay, so that a path that cannot be written
	// fails at once, not after it.
	var perSeed io.Writer
	if f.perSeed != "" {
		w, closeLog, cerr := createTSV("--gang-per-seed", f.perSeed, gangbench.PairedSeedsHeader)
		if cerr != nil {
			return cerr
		}
		defer closeTSV(&err, closeLog)
		perSeed = w
	}
	start := time.Now()
	cells, err := gangbench.Run(cfg)
	if errors.Is(err, gangbench.ErrNoTrace) {
		return fmt.Errorf("%w (the Kalos jobs come from AcmeTrace; see docs/performance/gangs.md)", err)
	}
	if err != nil {
		return err
	}
	var md strings.Builder
	loads := make([]string, len(f.loads))
	for i, l := range f.loads {
		loads[i] = strconv.FormatFloat(l, 'g', -1, 64)
	}
	fmt.Fprintf(&md, "Replayed %s at loads %s with seeds 1..%d in %s (%d workers).\n\n", filepath.Clean(f.dir), strings.Join(loads, ", "), f.seeds, time.Since(start).Round(time.Second), f.workers)
	if slices.Contains(f.policies, gangbench.PolicyGPULinkReserving) {
		// A holder reserves past its bound, so a strict bound not above it
		// leaves no soft phase (gangbench's passReserving).
		soft := "strict from the start"
		switch {
		case f.strict > max(f.starvation, f.preferred):
			soft = fmt.Sprintf("until the holder has waited %s, a job that fits nowhere else may still use the domain", f.strict)
		case f.strict > min(f.starvation, f.preferred):
			mode := gangbench.ModeRequired
			if f.preferred < f.starvation {
				mode = gangbench.ModePreferred
			}
			soft = fmt.Sprintf("until the holder has waited %s, a job that fits nowhere else may still use the domain (under %s; strict from the start under the other mode)", f.strict, mode)
		}
		fmt.Fprintf(&md, "%s: gpulink with the controller's starvation reservation: of the gangs waiting longer than %s (under required; %s under preferred), the one of the highest level (the oldest among equals) reserves the domain closest to fitting it; %s.\n\n", gangbench.PolicyGPULinkReserving, f.starvation, f.preferred, soft)
	}
	for _, name := range f.clusters {
		c, err := gangbench.ClusterByName(name, f.nodes)
		if err != nil {
			return err
		}
		fmt.Fprintf(&md, "- %s: %s.\n", name, c.Shape)
	}
	md.WriteString("\n")
	if err := gangbench.WriteMarkdown(&md, cells); err != nil {
		return err
	}
	fmt.Fprintf(&md, "## Paired differences\n\ngpulink minus each other row (the baselines, and gpulink:starvationBound, its own placement with the controller's starvation reservation), per seed on the same jobs, then mean ± standard error over the seeds; **ahead** or **behind** where |mean| > %d standard errors with at least %d seeds (gpulink better or worse; lower waits and fewer GPUs held idle are better), else within noise.\n\n", gangbench.NoiseSE, gangbench.MinPairedSeeds)
	if err := gangbench.WritePaired(&md, cells, gangbench.PolicyGPULink); err != nil {
		return err
	}
	if slices.Contains(f.policies, gangbench.PolicyGPULinkReserving) {
		fmt.Fprintf(&md, "## The chart's default against the baselines\n\n%s (the chart's default, controller.gangs.starvationBound) minus each baseline, the same way.\n\n", gangbench.PolicyGPULinkReserving)
		if err := gangbench.WritePaired(&md, cells, gangbench.PolicyGPULinkReserving, gangbench.PolicyGPULink); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(out, md.String()); err != nil {
		return err
	}
	if f.markdown != "" {
		if err := os.WriteFile(f.markdown, []byte(md.String()), 0o644); err != nil {
			return fmt.Errorf("write --gang-markdown: %w", err)
		}
	}
	if perSeed != nil {
		if err := gangbench.WritePairedSeeds(perSeed, cells, gangbench.PolicyGPULink); err != nil {
			return fmt.Errorf("--gang-per-seed %s: %w", f.perSeed, err)
		}
		if slices.Contains(f.policies, gangbench.PolicyGPULinkReserving) {
			if err := gangbench.WritePairedSeeds(perSeed, cells, gangbench.PolicyGPULinkReserving, gangbench.PolicyGPULink); err != nil {
				return fmt.Errorf("--gang-per-seed %s: %w", f.perSeed, err)
			}
		}
	}
	return nil
}
