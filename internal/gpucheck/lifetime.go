package gpucheck

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Names of the Concurrent MPS group's lifetime checks.
const (
	CheckGroupUnprepareFirst = "Concurrent group: unprepare 1st while 2nd runs"
	CheckGroupDaemonStops    = "Concurrent group: daemon stops with the last"
	// groupRunReps makes the second claim's kernels run for some seconds
	// (40 × about 55 ms at 30 % of an H200), so that the first claim's
	// unprepare falls in the middle.
	groupRunReps = 40
	// unprepareAfter is how long after the second claim's kernels start
	// the first claim is unprepared.
	unprepareAfter = 500 * time.Millisecond
	// groupCores of each claim: both fit on the GPU at once.
	groupCores = 30
	// daemonStopWait bounds the wait for the group's daemon to exit after
	// the last unprepare sent it quit.
	daemonStopWait = 10 * time.Second
	// slowRepFactor: a repetition of the second claim more than this
	// times its median means the first claim's unprepare disturbed it.
	slowRepFactor = 1.5
)

// groupLifetime checks the reference counting of a Concurrent group's MPS
// daemon on a GPU: two claims of the group join it (each runs the probe),
// the first is unprepared while the second's kernels run, which must go on
// undisturbed and computing right; the daemon and its directories stay
// until the second is unprepared, and then go.
func (s *suite) groupLifetime(ctx context.Context, prep Preparer, gpu ClaimedGPU) {
	a := ShareClaimOf(s.cfg.NodeName, ShareSpec{Name: "group-a", GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: groupCores, Concurrent: true})
	b := ShareClaimOf(s.cfg.NodeName, ShareSpec{Name: "group-b", GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: groupCores, Concurrent: true})
	idsA, err := prep.Prepare(ctx, a)
	if err != nil {
		s.rep.Add(CheckGroupUnprepareFirst, Fail, "prepare %s: %v", a.Name, err)
		return
	}
	idsB, err := prep.Prepare(ctx, b)
	if err != nil {
		s.rep.Add(CheckGroupUnprepareFirst, Fail, "prepare %s: %v", b.Name, err)
		s.rep.AddAll(Result{Name: CheckGroupDaemonStops, Status: Fail, Detail: strings.Join(s.unprepareErrs(ctx, prep, a), "; ")})
		return
	}
	w := s.work()
	w.Reps = groupRunReps
	// The first claim's container joins the daemon (its server) first.
	rA, errA := s.container(ctx, prep, idsA, RootfsHost)
	start := s.startAt()
	bundleB, errB := s.bundle(prep, probeRun{ids: idsB, mode: RootfsHost, args: w.args(start)})
	var errs []string
	switch {
	case errA != nil:
		errs = append(errs, fmt.Sprintf("%s's container: %v", a.Name, errA))
	case !s.cfg.DryRun && rA.Kernel != "ok":
		errs = append(errs, fmt.Sprintf("%s's container: kernel %q, CUDA %q", a.Name, rA.Kernel, rA.CUDA))
	case errB != nil:
		errs = append(errs, fmt.Sprintf("%s's container: %v", b.Name, errB))
	}
	if len(errs) > 0 {
		errs = append(errs, s.unprepareErrs(ctx, prep, a)...)
		s.rep.Add(CheckGroupUnprepareFirst, Fail, "%s", strings.Join(errs, "; "))
		s.rep.AddAll(Result{Name: CheckGroupDaemonStops, Status: Fail, Detail: strings.Join(s.unprepareErrs(ctx, prep, b), "; ")})
		return
	}
	pipe := rA.Env["CUDA_MPS_PIPE_DIRECTORY"]
	type result struct {
		r   *ProbeReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.runBundle(ctx, bundleB)
		done <- result{r, err}
	}()
	// In a dry run the shell probe does not wait for the start time.
	if !s.cfg.DryRun {
		sleepCtx(ctx, time.Until(start.Add(unprepareAfter)))
	}
	unprepared := time.Now()
	errs = append(errs, s.unprepareErrs(ctx, prep, a)...)
	if _, err := os.Stat(groupDir(pipe)); err != nil {
		errs = append(errs, fmt.Sprintf("after %s's unprepare the group's MPS directory is gone (%v), with %s still prepared", a.Name, err, b.Name))
	}
	res := <-done
	seen, runErrs := groupRunVerdict(res.r, res.err, w, unprepared, s.cfg.DryRun)
	errs = append(errs, runErrs...)
	if len(errs) > 0 && seen != "" {
		errs = append(errs, seen)
	}
	s.rep.Add(CheckGroupUnprepareFirst, statusOf(errs), "%s", detailOf(errs, seen))

	errs = s.unprepareErrs(ctx, prep, b)
	errs = append(errs, waitDaemonGone(ctx, pipe, s.deps.processesServing())...)
	s.rep.Add(CheckGroupDaemonStops, statusOf(errs), "%s", detailOf(errs, fmt.Sprintf("after %s's unprepare: %s and every process serving it gone", b.Name, groupDir(pipe))))
}

// groupRunVerdict judges the second claim's run: it computed right, the
// first claim's unprepare fell while its kernels ran, and no repetition
// was much slower than its median.
func groupRunVerdict(r *ProbeReport, runErr error, w Work, unprepared time.Time, dryRun bool) (string, []string) {
	if runErr != nil {
		return "", []string{fmt.Sprintf("group-b's container: %v", runErr)}
	}
	if dryRun {
		if r.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
			return "", []string{"group-b's container: no CUDA_MPS_PIPE_DIRECTORY"}
		}
		return "dry run: group-a unprepared while group-b's container ran; the group's directory stayed (no timing)", nil
	}
	t, err := TimingOf("group-b", r, w)
	if err != nil {
		return "", []string{err.Error()}
	}
	u := float64(unprepared.UnixMicro()) / 1e3
	seen := fmt.Sprintf("group-a unprepared %.0f ms into group-b's %.0f ms of kernels; group-b: %d repetitions computed right, median %.2f ms, slowest %.2f ms",
		u-t.Start, t.Elapsed(), w.Reps, t.MedianMS, t.MaxMS)
	var errs []string
	if u <= t.Start || u >= t.End {
		errs = append(errs, "group-a's unprepare did not fall while group-b's kernels ran")
	}
	if t.MaxMS > slowRepFactor*t.MedianMS {
		errs = append(errs, fmt.Sprintf("a repetition of group-b took %.2f ms, over %.1f times its median", t.MaxMS, slowRepFactor))
	}
	return seen, errs
}

// waitDaemonGone waits until the group's MPS directory is gone and no
// process has the group's pipe directory in its environment (the control
// daemon and the server it spawned).
func waitDaemonGone(ctx context.Context, pipe string, serving func(pipe string) ([]int, error)) []string {
	deadline := time.Now().Add(daemonStopWait)
	for {
		var left []string
		if _, err := os.Stat(groupDir(pipe)); err == nil {
			left = append(left, groupDir(pipe)+" still exists")
		}
		pids, err := serving(pipe)
		if err != nil {
			return []string{err.Error()}
		}
		if len(pids) > 0 {
			left = append(left, fmt.Sprintf("processes %v still serve %s", pids, pipe))
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return append(left, fmt.Sprintf("after %s", daemonStopWait))
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// processesServing is Deps.Processes, or the /proc scan.
func (d Deps) processesServing() func(string) ([]int, error) {
	if d.Processes != nil {
		return d.Processes
	}
	return func(pipe string) ([]int, error) { return ProcessesWithEnv("/proc", "CUDA_MPS_PIPE_DIRECTORY="+pipe) }
}

// ProcessesWithEnv lists the processes under procRoot whose environment
// holds the variable kv (NAME=value) exactly. Processes that end or whose
// environment cannot be read meanwhile are skipped.
func ProcessesWithEnv(procRoot, kv string) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("listing processes in %s: %w", procRoot, err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		if err != nil {
			// Ended meanwhile, or a kernel thread: not a daemon of ours.
			continue
		}
		for _, v := range bytes.Split(b, []byte{0}) {
			if string(v) == kv {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, nil
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
