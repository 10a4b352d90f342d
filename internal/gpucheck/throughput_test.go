package gpucheck

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

func TestParseProbeSpin(t *testing.T) {
	out := "gpucheck: kernel=ok\ngpucheck: sms=40\ngpucheck: spin.start=1000.500\ngpucheck: spin.late=2.250\n" +
		"gpucheck: spin.end=1200.500\ngpucheck: spin.ms=20.000,19.500,21.000\ngpucheck: spin=ok\n"
	r, err := ParseProbe([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.SMs != 40 || r.Spin != "ok" || r.SpinStart != 1000.5 || r.SpinEnd != 1200.5 || r.SpinLate != 2.25 || !slices.Equal(r.SpinMS, []float64{20, 19.5, 21}) {
		t.Errorf("parsed %+v", r)
	}
	w := Work{Reps: 3, Blocks: 1, Iters: 1}
	tm, err := TimingOf("c", r, w)
	if err != nil {
		t.Fatal(err)
	}
	if tm.MedianMS != 20 || tm.MaxMS != 21 || tm.Elapsed() != 200 || tm.SMs != 40 {
		t.Errorf("timing %+v", tm)
	}
	// Without --start-at there is no lateness.
	r, err = ParseProbe([]byte("gpucheck: spin=ok\n"))
	if err != nil || !math.IsNaN(r.SpinLate) {
		t.Errorf("spin.late unset: %v %v", r.SpinLate, err)
	}
	for _, bad := range []string{"gpucheck: spin.ms=1,x", "gpucheck: spin.ms=0", "gpucheck: sms=none", "gpucheck: spin.start=NaN", "gpucheck: spin.end=1e400"} {
		if _, err := ParseProbe([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestTimingOfRefusesIncompleteRuns(t *testing.T) {
	w := Work{Reps: 2}
	ok := &ProbeReport{Kernel: "ok", Spin: "ok", SpinMS: []float64{1, 2}, SpinStart: 1, SpinEnd: 5}
	for _, tc := range []struct {
		change func(*ProbeReport)
		want   string
	}{
		{func(r *ProbeReport) { r.CUDA = "fail:no device" }, "CUDA: fail:no device"},
		{func(r *ProbeReport) { r.Kernel = "" }, "first kernel"},
		{func(r *ProbeReport) { r.Spin = "" }, "did not report spin_fma"},
		{func(r *ProbeReport) { r.Spin = "fail:wrong result" }, "spin_fma: fail:wrong result"},
		{func(r *ProbeReport) { r.SpinMS = r.SpinMS[:1] }, "1 repetition times, want 2"},
		{func(r *ProbeReport) { r.SpinEnd = r.SpinStart }, "is not before"},
	} {
		r := *ok
		tc.change(&r)
		if _, err := TimingOf("x", &r, w); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want %q, got %v", tc.want, err)
		}
	}
	if _, err := TimingOf("x", ok, w); err != nil {
		t.Error(err)
	}
}

func TestCheckSMShareBand(t *testing.T) {
	whole := Timing{MedianMS: 10}
	for _, tc := range []struct {
		shareMS float64
		pct     float64
		pass    bool
	}{
		{33.3, 30.0, true},  // 30 %
		{38.0, 26.3, true},  // 26.3 %: 38 of 132 SMs less a wave tail
		{50.0, 20.0, false}, // 20 %: the limit cut too much
		{25.0, 40.0, false}, // 40 %: not limited to 30
	} {
		pct, errs := CheckSMShare(whole, Timing{MedianMS: tc.shareMS}, 30)
		if math.Abs(pct-tc.pct) > 0.1 || (len(errs) == 0) != tc.pass {
			t.Errorf("share %.1f ms: %.1f %%, errs %v; want %.1f %%, pass %v", tc.shareMS, pct, errs, tc.pct, tc.pass)
		}
	}
}

func TestCheckTogetherAndOverlap(t *testing.T) {
	a := Timing{Name: "a", Start: 0, End: 100, Late: 1}
	b := Timing{Name: "b", Start: 50, End: 150, Late: 51}
	if errs := CheckTogether([]Timing{a, b}); len(errs) != 0 {
		t.Errorf("overlapping clients: %v", errs)
	}
	if got := Overlap([]Timing{a, b}); math.Abs(got-1.0/3) > 1e-9 {
		t.Errorf("overlap %v, want 1/3", got)
	}
	c := Timing{Name: "c", Start: 100, End: 200, Late: 400}
	errs := CheckTogether([]Timing{a, c})
	if len(errs) != 2 || !strings.Contains(errs[0], "c started its kernels 400 ms after") || !strings.Contains(errs[1], "did not overlap") {
		t.Errorf("late, disjoint clients: %v", errs)
	}
	if Overlap([]Timing{a, c}) != 0 {
		t.Error("disjoint clients overlap")
	}
}

func TestColocatedAndPriority(t *testing.T) {
	whole := Timing{MedianMS: 10}
	c := ColocatedOf(whole, []Timing{{MedianMS: 100}, {MedianMS: 100}, {MedianMS: 25}})
	if c.String() != "10.0 % + 10.0 % + 40.0 % = 60.0 % of the whole GPU" {
		t.Errorf("colocated %s", c)
	}
	if errs := c.CheckEachWithin(30); len(errs) != 1 || !strings.Contains(errs[0], "client 3 ran at 40.0 %") {
		t.Errorf("each within 30: %v", errs)
	}
	high, low, sooner := PriorityOf(Timing{End: 1300}, Timing{End: 2000}, 1000)
	if high != 300 || low != 1000 || math.Abs(sooner-0.7) > 1e-9 {
		t.Errorf("priority %v %v %v", high, low, sooner)
	}
}

func TestWorkArgs(t *testing.T) {
	w := Work{Reps: 3, Blocks: 4, Iters: 5}
	if got := strings.Join(w.args(time.Time{}), " "); got != "--spin-reps 3 --spin-blocks 4 --spin-iters 5" {
		t.Errorf("args %q", got)
	}
	if got := w.args(time.UnixMilli(1234)); !slices.Equal(got[len(got)-2:], []string{"--start-at", "1234"}) {
		t.Errorf("args with a start %q", got)
	}
}

func TestProcessesWithEnv(t *testing.T) {
	proc := t.TempDir()
	for pid, env := range map[string]string{
		"10":   "A=1\x00CUDA_MPS_PIPE_DIRECTORY=/mps/g/pipe\x00",
		"11":   "CUDA_MPS_PIPE_DIRECTORY=/mps/g/pipe2\x00",
		"self": "CUDA_MPS_PIPE_DIRECTORY=/mps/g/pipe\x00",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "environ"), []byte(env), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A process that ended: its directory without environ.
	if err := os.MkdirAll(filepath.Join(proc, "12"), 0o755); err != nil {
		t.Fatal(err)
	}
	pids, err := ProcessesWithEnv(proc, "CUDA_MPS_PIPE_DIRECTORY=/mps/g/pipe")
	if err != nil || !slices.Equal(pids, []int{10}) {
		t.Errorf("pids %v, %v; want [10]", pids, err)
	}
}

// Two clients of one server competing for every SM whose priorities make
// no difference: the row fails, saying so.
func TestPriorityWithoutEffectFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs, noPriority: true}
	cfg := gpuConfig(t)
	got := results(t, Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir)).Results)
	wantResult(t, got, CheckPriorityConcFull, Fail, "did not finish at least 10 % sooner", "priority 0 finished 0 % sooner")
}

// A Concurrent group's daemon that outlives its last claim fails the row.
func TestGroupDaemonLeftRunningFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs}
	cfg := gpuConfig(t)
	deps := suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir)
	deps.Processes = func(pipe string) ([]int, error) {
		if strings.Contains(pipe, "-gpu-") {
			return []int{4242}, nil
		}
		return nil, nil
	}
	got := results(t, Run(ctx, cfg, deps).Results)
	wantResult(t, got, CheckGroupDaemonStops, Fail, "processes [4242] still serve")
}

// Were a non-root daemon without capabilities to serve a client of another
// user, the chart would not need root: the row that expects the refusal
// fails, saying so.
func TestNonRootDaemonServingAnotherUserFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs, anyUser: true}
	cfg := gpuConfig(t)
	got := results(t, Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir)).Results)
	wantResult(t, got, CheckDaemonPodNonRoot, Fail, "the client was not refused", "a daemon of UID 65532 without capabilities served a client of UID 1000")
	wantResult(t, got, CheckDaemonPodChart, Pass)
}
