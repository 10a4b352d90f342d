package gpucheck

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
)

// Names of the throughput, co-location and priority checks (sharing.go).
// Each measures the probe's spin_fma (Work) and compares it with the same
// work on the whole GPU alone (CheckSpinWhole).
const (
	CheckSpinWhole        = "SM: whole GPU alone (baseline)"
	CheckSMLimit          = "SM: one share alone vs whole GPU"
	CheckColocIsolated    = "co-located: 3 shares, Isolated"
	CheckColocConcurrent  = "co-located: 3 shares, Concurrent"
	CheckPriorityConc     = "priority: 0 vs 1, Concurrent, cores 50 each"
	CheckPriorityConcFull = "priority: 0 vs 1, Concurrent, both raised to 100"
	CheckPriorityIsolated = "priority: 0 vs 1, Isolated, cores 50 each"
	colocatedShares       = 3
	colocatedCores        = 30
	priorityCores         = 50
	defaultStartLead      = 5 * time.Second
	dryRunEnvOnly         = "dry run: prepare and the containers' MPS environment only, no timing"
	dryRunTimingNeedsAGPU = "dry run: needs a GPU (the timed kernel)"
	smLimitCores          = 30
	errNoBaselineMeasured = "no baseline: the whole GPU's time of the same work was not measured (see that row)"
)

// work is the configured fixed work, DefaultWork when unset.
func (s *suite) work() Work {
	if s.cfg.Work.Reps > 0 {
		return s.cfg.Work
	}
	return DefaultWork
}

// startAt is the common start time of containers started now: late
// enough for runc, CUDA's start and the MPS server's spawn.
func (s *suite) startAt() time.Time {
	lead := s.cfg.StartLead
	if lead <= 0 {
		lead = defaultStartLead
	}
	return time.Now().Add(lead)
}

// sharingRows measures what shares give: the whole GPU alone, one
// cores:30 share alone, three co-located in each MPS mode, and the
// priority in each mode.
func (s *suite) sharingRows(ctx context.Context, prep Preparer, gpu ClaimedGPU) {
	whole, ok := s.baseline(ctx, prep, gpu)
	base := func() (Timing, bool) { return whole, ok }
	s.smLimit(ctx, prep, gpu, base)
	s.colocated(ctx, prep, gpu, base, false)
	s.colocated(ctx, prep, gpu, base, true)
	s.priority(ctx, prep, gpu, CheckPriorityConc, true, false)
	s.priority(ctx, prep, gpu, CheckPriorityConcFull, true, true)
	s.priority(ctx, prep, gpu, CheckPriorityIsolated, false, false)
	s.groupLifetime(ctx, prep, gpu)
	s.daemonPodRows(ctx, gpu, base)
}

// baseline runs the fixed work in a whole-GPU claim's container, alone.
func (s *suite) baseline(ctx context.Context, prep Preparer, gpu ClaimedGPU) (Timing, bool) {
	if s.cfg.DryRun {
		s.rep.Add(CheckSpinWhole, Skip, dryRunTimingNeedsAGPU)
		return Timing{}, false
	}
	claim := WholeClaim(s.cfg.NodeName, gpu.Index)
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		s.rep.Add(CheckSpinWhole, Fail, "%v", err)
		return Timing{}, false
	}
	w := s.work()
	r, err := s.container(ctx, prep, ids, RootfsHost, w.args(time.Time{})...)
	var errs []string
	var t Timing
	if err == nil {
		t, err = TimingOf("whole GPU", r, w)
	}
	if err != nil {
		errs = append(errs, err.Error())
	}
	errs = append(errs, s.unprepareErrs(ctx, prep, claim)...)
	if len(errs) > 0 {
		s.rep.Add(CheckSpinWhole, Fail, "%s", strings.Join(errs, "; "))
		return Timing{}, false
	}
	s.rep.Add(CheckSpinWhole, Pass, "spin_fma %s: median %.2f ms, slowest %.2f ms; %d SMs", w, t.MedianMS, t.MaxMS, t.SMs)
	return t, true
}

// String describes the work for a row.
func (w Work) String() string {
	return fmt.Sprintf("%d x (%d blocks x 256 threads x %d iterations x 4 FMA)", w.Reps, w.Blocks, w.Iters)
}

// smLimit runs the work in one Isolated cores:30 share, alone.
func (s *suite) smLimit(ctx context.Context, prep Preparer, gpu ClaimedGPU, base func() (Timing, bool)) {
	spec := ShareSpec{Name: "sm-limit", GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: smLimitCores}
	reps, _, errs := s.runShares(ctx, prep, []ShareSpec{spec}, false)
	if s.cfg.DryRun || len(errs) > 0 {
		s.addShareRow(CheckSMLimit, errs, "cores %d: %s", spec.Cores, dryRunEnvOnly)
		return
	}
	whole, ok := base()
	if !ok {
		s.rep.Add(CheckSMLimit, Fail, errNoBaselineMeasured)
		return
	}
	t, err := TimingOf("share", reps[0], s.work())
	if err != nil {
		s.rep.Add(CheckSMLimit, Fail, "%v", err)
		return
	}
	pct, errs := CheckSMShare(whole, t, spec.Cores)
	seen := fmt.Sprintf("cores %d: %.1f %% of the whole GPU (median %.2f ms vs %.2f ms; pass band %d ± %.0f points: MPS gives whole SMs); CUDA reports %d SMs in the share, %d on the whole GPU",
		spec.Cores, pct, t.MedianMS, whole.MedianMS, spec.Cores, SMBandPoints, t.SMs, whole.SMs)
	if len(errs) > 0 {
		errs = append(errs, seen)
	}
	s.rep.Add(CheckSMLimit, statusOf(errs), "%s", detailOf(errs, seen))
}

// colocated runs the work in three cores:30 shares of one GPU at the same
// time: three Isolated claims (three MPS servers) or three Concurrent
// claims of one namespace (one server).
func (s *suite) colocated(ctx context.Context, prep Preparer, gpu ClaimedGPU, base func() (Timing, bool), concurrent bool) {
	name, prefix := CheckColocIsolated, "iso"
	if concurrent {
		name, prefix = CheckColocConcurrent, "conc"
	}
	specs := make([]ShareSpec, colocatedShares)
	for i := range specs {
		specs[i] = ShareSpec{Name: fmt.Sprintf("%s-%d", prefix, i+1), GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: colocatedCores, Concurrent: concurrent}
	}
	reps, _, errs := s.runShares(ctx, prep, specs, true)
	if s.cfg.DryRun || len(errs) > 0 {
		s.addShareRow(name, errs, "%d x cores %d: %s", colocatedShares, colocatedCores, dryRunEnvOnly)
		return
	}
	whole, ok := base()
	if !ok {
		s.rep.Add(name, Fail, errNoBaselineMeasured)
		return
	}
	ts, errs := timings(reps, s.work(), "client")
	if len(errs) > 0 {
		s.rep.Add(name, Fail, "%s", strings.Join(errs, "; "))
		return
	}
	c := ColocatedOf(whole, ts)
	errs = append(CheckTogether(ts), c.CheckEachWithin(colocatedCores)...)
	seen := fmt.Sprintf("%d x cores %d started together (overlap %.0f %%, latest start %.0f ms late): %s; each client's time %s",
		colocatedShares, colocatedCores, 100*Overlap(ts), maxLate(ts), c, elapsedList(ts))
	if len(errs) > 0 {
		errs = append(errs, seen)
	}
	s.rep.Add(name, statusOf(errs), "%s", detailOf(errs, seen))
}

// priority runs the same work in a priority 0 and a priority 1 share of
// one GPU, cores 50 each (the most two shares of a GPU add up to), started
// together: under Concurrent two clients of one server, under Isolated two
// servers. A priority orders work that waits for SMs; whether two clients
// of 50 % wait for each other is what the row shows. With raise, both
// clients set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 themselves (a
// Concurrent client may: its limits are its environment), so that they
// compete for every SM: there the priority 0 client must finish at least
// PriorityMargin sooner, or MPS's client priority does nothing here.
func (s *suite) priority(ctx context.Context, prep Preparer, gpu ClaimedGPU, name string, concurrent, raise bool) {
	prefix := "prio-iso"
	if concurrent {
		prefix = "prio-conc"
	}
	high, low := 0, 1
	specs := []ShareSpec{
		{Name: prefix + "-high", GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: priorityCores, Concurrent: concurrent, Priority: &high},
		{Name: prefix + "-low", GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: priorityCores, Concurrent: concurrent, Priority: &low},
	}
	var extra []string
	cores := fmt.Sprintf("cores %d each", priorityCores)
	if raise {
		extra = []string{"--set-env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"}
		cores = fmt.Sprintf("cores %d each, raised to 100 by both clients", priorityCores)
	}
	reps, start, errs := s.runShares(ctx, prep, specs, true, extra...)
	if s.cfg.DryRun || len(errs) > 0 {
		s.addShareRow(name, errs, "priorities 0 and 1, %s: %s", cores, dryRunEnvOnly)
		return
	}
	ts, errs := timings(reps, s.work(), "priority 0", "priority 1")
	if len(errs) > 0 {
		s.rep.Add(name, Fail, "%s", strings.Join(errs, "; "))
		return
	}
	errs = CheckTogether(ts)
	highMS, lowMS, sooner := PriorityOf(ts[0], ts[1], float64(start.UnixMilli()))
	seen := fmt.Sprintf("%s, started together: priority 0 done after %.0f ms (median repetition %.2f ms), priority 1 after %.0f ms (%.2f ms): priority 0 finished %.0f %% sooner",
		cores, highMS, ts[0].MedianMS, lowMS, ts[1].MedianMS, 100*sooner)
	if raise && sooner < PriorityMargin {
		errs = append(errs, fmt.Sprintf("priority 0 did not finish at least %.0f %% sooner than priority 1, two clients of one MPS server competing for every SM", 100*PriorityMargin))
	}
	if len(errs) > 0 {
		errs = append(errs, seen)
	}
	s.rep.Add(name, statusOf(errs), "%s", detailOf(errs, seen))
}

// runShares prepares the shares, runs the fixed work in one container of
// each (all at once, and with together set from a common start time,
// which it returns; extra goes before the work's arguments) and
// unprepares them. In a dry run the containers run
// the shell probe and only their MPS environment is checked
// (shareEnvErrs).
func (s *suite) runShares(ctx context.Context, prep Preparer, specs []ShareSpec, together bool, extra ...string) ([]*ProbeReport, time.Time, []string) {
	claims := make([]*resourceapi.ResourceClaim, 0, len(specs))
	idsOf := make([][]string, 0, len(specs))
	var errs []string
	for _, sp := range specs {
		claim := ShareClaimOf(s.cfg.NodeName, sp)
		ids, err := prep.Prepare(ctx, claim)
		if err != nil {
			errs = append(errs, fmt.Sprintf("prepare %s: %v", sp.Name, err))
			break
		}
		claims = append(claims, claim)
		idsOf = append(idsOf, ids)
	}
	var reps []*ProbeReport
	var start time.Time
	if len(errs) == 0 {
		// After the prepares: starting an MPS daemon takes a while.
		if together {
			start = s.startAt()
		}
		runs := make([]probeRun, len(idsOf))
		for i, ids := range idsOf {
			runs[i] = probeRun{ids: ids, mode: RootfsHost, args: append(append([]string{}, extra...), s.work().args(start)...)}
		}
		var err error
		if reps, err = s.together(ctx, prep, runs); err != nil {
			errs = append(errs, err.Error())
		} else {
			errs = append(errs, shareEnvErrs(specs, reps, slices.ContainsFunc(extra, func(a string) bool {
				return strings.HasPrefix(a, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=")
			}))...)
		}
	}
	for i := len(claims) - 1; i >= 0; i-- {
		errs = append(errs, s.unprepareErrs(ctx, prep, claims[i])...)
	}
	return reps, start, errs
}

// shareEnvErrs checks what MPS environment each share's container got:
// a pipe directory, its own one per Isolated claim and one for all the
// Concurrent claims (their group's daemon); under Concurrent the cores as
// the client's active thread percentage, unless the client raised it
// itself; the claim's priority.
func shareEnvErrs(specs []ShareSpec, reps []*ProbeReport, raised bool) []string {
	var errs []string
	pipes := map[string]bool{}
	for i, sp := range specs {
		env := reps[i].Env
		pipe := env["CUDA_MPS_PIPE_DIRECTORY"]
		if pipe == "" {
			errs = append(errs, sp.Name+": no CUDA_MPS_PIPE_DIRECTORY")
		}
		pipes[pipe] = true
		if want := fmt.Sprint(sp.Cores); sp.Concurrent && !raised && env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != want {
			errs = append(errs, fmt.Sprintf("%s: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want %s", sp.Name, env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], want))
		}
		if sp.Priority != nil && env["CUDA_MPS_CLIENT_PRIORITY"] != fmt.Sprint(*sp.Priority) {
			errs = append(errs, fmt.Sprintf("%s: CUDA_MPS_CLIENT_PRIORITY=%q, want %d", sp.Name, env["CUDA_MPS_CLIENT_PRIORITY"], *sp.Priority))
		}
	}
	if len(specs) > 1 {
		concurrent := specs[0].Concurrent
		switch {
		case concurrent && len(pipes) != 1:
			errs = append(errs, fmt.Sprintf("the Concurrent claims got %d pipe directories, want their group's one", len(pipes)))
		case !concurrent && len(pipes) != len(specs):
			errs = append(errs, fmt.Sprintf("the Isolated claims got %d pipe directories, want one each (%d)", len(pipes), len(specs)))
		}
	}
	return errs
}

// addShareRow adds a row that ends before any timing: failed with errs,
// or passed in a dry run with the detail.
func (s *suite) addShareRow(name string, errs []string, format string, args ...any) {
	if len(errs) > 0 {
		s.rep.Add(name, Fail, "%s", strings.Join(errs, "; "))
		return
	}
	s.rep.Add(name, Pass, format, args...)
}

// unprepareErrs unprepares a claim and says what went wrong, if anything.
func (s *suite) unprepareErrs(ctx context.Context, prep Preparer, claim *resourceapi.ResourceClaim) []string {
	if err := prep.Unprepare(context.WithoutCancel(ctx), claim); err != nil {
		return []string{fmt.Sprintf("unprepare %s: %v", claim.Name, err)}
	}
	return nil
}

// timings reads each report's measurement, named by names (the last
// name numbered when there are more reports).
func timings(reps []*ProbeReport, w Work, names ...string) ([]Timing, []string) {
	var ts []Timing
	var errs []string
	for i, r := range reps {
		name := names[min(i, len(names)-1)]
		if len(names) < len(reps) {
			name = fmt.Sprintf("%s %d", name, i+1)
		}
		t, err := TimingOf(name, r, w)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		ts = append(ts, t)
	}
	return ts, errs
}

func maxLate(ts []Timing) float64 {
	late := 0.0
	for _, t := range ts {
		if t.Late > late {
			late = t.Late
		}
	}
	return late
}

// elapsedList is "1520, 1533, 1518 ms".
func elapsedList(ts []Timing) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("%.0f", t.Elapsed())
	}
	return strings.Join(parts, ", ") + " ms"
}

// groupDir is the MPS directory of a pipe directory (its parent).
func groupDir(pipe string) string { return filepath.Dir(pipe) }
