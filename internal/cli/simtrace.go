package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpulink/gpulink/internal/tracebench"
)

// traceFlags are `gpulink simulate --trace`'s options: the replay of FGD's
// production trace (internal/tracebench).
type traceFlags struct {
	dir        string
	lists      []string
	seeds      int
	policies   []string
	stride     int
	topologies string
	markdown   string
	svg        string
	minPercent int
	workers    int
	noMemory   bool
	failures   string
	endState   string
}

func (f *traceFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "trace", "", "replay FGD's production trace from this directory (openb_*.csv) instead of a scenario")
	fl.StringSliceVar(&f.lists, "lists", []string{"default", "multigpu50", "gpushare100"}, "with --trace: task lists to replay (openb_pod_list_<name>.csv)")
	fl.IntVar(&f.seeds, "seeds", 10, "with --trace: Monte-Carlo repetitions (seeds 1..N)")
	fl.StringSliceVar(&f.policies, "policies", nil, "with --trace: policies to replay (default all: "+strings.Join(tracebench.AllPolicies, ",")+")")
	fl.IntVar(&f.stride, "node-stride", 1, "with --trace: keep every N-th node only (quick runs)")
	fl.StringVar(&f.topologies, "topologies", "driver/topology/testdata", "with --trace: directory of the topology files node models are mapped to")
	fl.StringVar(&f.markdown, "markdown", "", "with --trace: also write the tables to this file")
	fl.StringVar(&f.svg, "svg", "", "with --trace: write the chart to this SVG file")
	fl.IntVar(&f.minPercent, "min-percent", 70, "with --trace: first arrival step (in % of capacity) in tables and chart")
	fl.IntVar(&f.workers, "workers", runtime.GOMAXPROCS(0), "with --trace: replays run in parallel")
	fl.StringVar(&f.failures, "failures", "", "with --trace: write every task a policy could not place, with the state of the nodes it may run on, to this file (tab-separated)")
	fl.StringVar(&f.endState, "end-state", "", "with --trace: write each replay's end state, one line per GPU model (GPU left whole and in pieces, CPU left, what pinned, unpinned and CPU-only tasks took), to this file (tab-separated)")
	fl.BoolVar(&f.noMemory, "ignore-memory", false, "with --trace: count no task's memory, as the FGD paper's simulator does (every policy)")
}

func (f *traceFlags) run(out io.Writer) (err error) {
	if f.seeds < 1 {
		return usageError{fmt.Errorf("--seeds must be at least 1, got %d", f.seeds)}
	}
	opt := tracebench.Options{TopologyDir: f.topologies, Policies: f.policies, NodeStride: f.stride, Workers: f.workers, IgnoreMemory: f.noMemory}
	for s := 1; s <= f.seeds; s++ {
		opt.Seeds = append(opt.Seeds, uint64(s))
	}
	for _, log := range []struct {
		flag, path, header string
		into               *io.Writer
	}{
		{"--failures", f.failures, tracebench.FailureHeader, &opt.Failures},
		{"--end-state", f.endState, tracebench.EndStateHeader, &opt.EndState},
	} {
		if log.path == "" {
			continue
		}
		w, closeLog, lerr := createTSV(log.flag, log.path, log.header)
		if lerr != nil {
			return lerr
		}
		defer closeTSV(&err, closeLog)
		*log.into = w
	}
	start := time.Now()
	var results []*tracebench.ListResult
	// offGPU is what tainting the GPU nodes moves to CPU nodes, per list
	// (with the taint row only).
	var offGPU strings.Builder
	for _, list := range f.lists {
		tr, err := tracebench.Load(f.dir, list)
		if errors.Is(err, tracebench.ErrNoTrace) {
			return fmt.Errorf("%w (the trace is published in alibaba/clusterdata, cluster-trace-gpu-v2023/csv)", err)
		}
		if err != nil {
			return err
		}
		r, err := tracebench.Replay(tr, opt)
		if err != nil {
			return fmt.Errorf("list %s: %w", list, err)
		}
		results = append(results, r)
		if tracebench.HasTaintRow(opt) {
			steps, err := tracebench.OffGPUDemand(tr, opt)
			if err != nil {
				return fmt.Errorf("list %s: %w", list, err)
			}
			if err := tracebench.WriteOffGPUDemand(&offGPU, tr, steps, opt, f.minPercent); err != nil {
				return fmt.Errorf("list %s: %w", list, err)
			}
		}
	}
	elapsed := time.Since(start).Round(time.Second)
	var md strings.Builder
	fmt.Fprintf(&md, "Replayed %s with seeds 1..%d in %s (%d workers, GOMAXPROCS %d).\n\n", filepath.Clean(f.dir), f.seeds, elapsed, f.workers, runtime.GOMAXPROCS(0))
	if f.noMemory {
		md.WriteString("Memory not counted (--ignore-memory), as the FGD paper's simulator.\n\n")
	}
	if err := tracebench.WriteMarkdown(&md, results, f.minPercent); err != nil {
		return err
	}
	md.WriteString(offGPU.String())
	if _, err := io.WriteString(out, md.String()); err != nil {
		return err
	}
	if f.markdown != "" {
		if err := os.WriteFile(f.markdown, []byte(md.String()), 0o644); err != nil {
			return fmt.Errorf("write --markdown: %w", err)
		}
	}
	if f.svg != "" {
		var svg strings.Builder
		if err := tracebench.WriteSVG(&svg, results, f.minPercent); err != nil {
			return err
		}
		if err := os.WriteFile(f.svg, []byte(svg.String()), 0o644); err != nil {
			return fmt.Errorf("write --svg: %w", err)
		}
	}
	return nil
}
