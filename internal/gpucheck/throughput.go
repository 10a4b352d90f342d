package gpucheck

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Work is the fixed work of the throughput checks: the probe's spin_fma
// kernel (probe/gpucheck-probe.cu), Blocks blocks of 256 threads, each
// thread Iters iterations of four independent fmaf chains, repeated Reps
// times and timed with CUDA events. It is compute-bound and has many
// more blocks than a GPU runs at once (65536 against 132 SMs × 8 resident
// blocks of 256 threads on an H100/H200: about 62 waves on the whole GPU),
// so its time is set by the number of SMs that run it, and the last,
// partly filled wave changes a measured ratio by less than 2 %.
type Work struct {
	Reps, Blocks, Iters int
}

// DefaultWork is about 1.1 TFLOP per repetition: some 17 ms on a whole
// H200 (about 67 TFLOP/s of FP32 by NVIDIA's datasheet), 55 ms at 30 % of
// its SMs.
var DefaultWork = Work{Reps: 10, Blocks: 65536, Iters: 8192}

// args are the probe's arguments for this work, starting at startAt when
// it is not zero (the clients of one check start together).
func (w Work) args(startAt time.Time) []string {
	a := []string{"--spin-reps", strconv.Itoa(w.Reps), "--spin-blocks", strconv.Itoa(w.Blocks), "--spin-iters", strconv.Itoa(w.Iters)}
	if !startAt.IsZero() {
		a = append(a, "--start-at", strconv.FormatInt(startAt.UnixMilli(), 10))
	}
	return a
}

// SMBandPoints is how far, in percentage points of the whole GPU's
// throughput, a share's measured throughput may be from its cores
// percentage. MPS turns an active thread percentage into a whole number
// of SMs (on Hopper in pairs, one TPC): 30 % of 132 SMs is 39.6, so a
// share runs on 38 to 42 SMs, 28.8 to 31.8 % of the GPU; the kernel's
// last wave (under 2 %) and clock changes between the runs add to that.
const SMBandPoints = 5.0

// maxLateMS is how late a client may start its kernels after the common
// start time and still count as started together.
const maxLateMS = 250.0

// Timing is one client's measurement of the fixed work.
type Timing struct {
	// Name says whose it is in a row's detail.
	Name string
	// MedianMS is the median repetition time (CUDA events).
	MedianMS float64
	// MaxMS is the slowest repetition.
	MaxMS float64
	// Start and End are the wall clock around the repetitions, ms since
	// the epoch; Late is how late Start was after the common start time
	// (NaN when there was none).
	Start, End, Late float64
	// SMs is the multiprocessor count CUDA reported to the client.
	SMs int
}

// Elapsed is the client's time from its first repetition's start to its
// last one's end.
func (t Timing) Elapsed() float64 { return t.End - t.Start }

// TimingOf reads one client's measurement from its probe report: the
// kernel ran every repetition and computed right.
func TimingOf(name string, r *ProbeReport, w Work) (Timing, error) {
	switch {
	case r.CUDA != "":
		return Timing{}, fmt.Errorf("%s: CUDA: %s", name, r.CUDA)
	case r.Kernel != "ok":
		return Timing{}, fmt.Errorf("%s: the probe's first kernel: %q", name, r.Kernel)
	case r.Spin == "":
		return Timing{}, fmt.Errorf("%s: the probe did not report spin_fma (did it run to the end?)", name)
	case r.Spin != "ok":
		return Timing{}, fmt.Errorf("%s: spin_fma: %s", name, r.Spin)
	case len(r.SpinMS) != w.Reps:
		return Timing{}, fmt.Errorf("%s: %d repetition times, want %d", name, len(r.SpinMS), w.Reps)
	case !(r.SpinEnd > r.SpinStart):
		return Timing{}, fmt.Errorf("%s: spin.start %.3f is not before spin.end %.3f", name, r.SpinStart, r.SpinEnd)
	}
	ms := slices.Sorted(slices.Values(r.SpinMS))
	return Timing{
		Name: name, MedianMS: median(ms), MaxMS: ms[len(ms)-1],
		Start: r.SpinStart, End: r.SpinEnd, Late: r.SpinLate, SMs: r.SMs,
	}, nil
}

// median of sorted values.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// Percent is a client's throughput as a percentage of the whole GPU's
// alone: the same work, so the inverse ratio of the median times.
func Percent(whole, client Timing) float64 { return 100 * whole.MedianMS / client.MedianMS }

// CheckSMShare checks a share's throughput alone against its cores
// percentage: within SMBandPoints of it.
func CheckSMShare(whole, share Timing, cores int64) (float64, []string) {
	pct := Percent(whole, share)
	if math.Abs(pct-float64(cores)) > SMBandPoints {
		return pct, []string{fmt.Sprintf("the share ran at %.1f %% of the whole GPU, want %d %% ± %.0f points (MPS rounds the active thread percentage to whole SMs)", pct, cores, SMBandPoints)}
	}
	return pct, nil
}

// CheckTogether checks that the clients of one check ran their kernels at
// the same time: each started at most maxLateMS after the common start,
// and all were running at one moment (every start before every end).
func CheckTogether(ts []Timing) []string {
	var errs []string
	var lastStart, firstEnd = math.Inf(-1), math.Inf(1)
	for _, t := range ts {
		if !math.IsNaN(t.Late) && t.Late > maxLateMS {
			errs = append(errs, fmt.Sprintf("%s started its kernels %.0f ms after the common start (at most %.0f)", t.Name, t.Late, maxLateMS))
		}
		lastStart = max(lastStart, t.Start)
		firstEnd = min(firstEnd, t.End)
	}
	if len(ts) > 1 && lastStart >= firstEnd {
		errs = append(errs, "the clients' kernels did not overlap in time: one ended before another started")
	}
	return errs
}

// Overlap is the share of the clients' whole span (first start to last
// end) during which all of them were running.
func Overlap(ts []Timing) float64 {
	lastStart, firstEnd := math.Inf(-1), math.Inf(1)
	firstStart, lastEnd := math.Inf(1), math.Inf(-1)
	for _, t := range ts {
		lastStart, firstEnd = max(lastStart, t.Start), min(firstEnd, t.End)
		firstStart, lastEnd = min(firstStart, t.Start), max(lastEnd, t.End)
	}
	if firstEnd <= lastStart || lastEnd <= firstStart {
		return 0
	}
	return (firstEnd - lastStart) / (lastEnd - firstStart)
}

// Colocated sums up clients that ran together: each one's throughput as a
// percentage of the whole GPU's alone, and their sum.
type Colocated struct {
	Each []float64
	Sum  float64
}

// ColocatedOf computes Colocated.
func ColocatedOf(whole Timing, ts []Timing) Colocated {
	var c Colocated
	for _, t := range ts {
		p := Percent(whole, t)
		c.Each = append(c.Each, p)
		c.Sum += p
	}
	return c
}

// String is "30.1 % + 29.8 % + 30.3 % = 90.2 %".
func (c Colocated) String() string {
	parts := make([]string, len(c.Each))
	for i, p := range c.Each {
		parts[i] = fmt.Sprintf("%.1f %%", p)
	}
	return fmt.Sprintf("%s = %.1f %% of the whole GPU", strings.Join(parts, " + "), c.Sum)
}

// CheckEachWithin checks that no co-located client got more than its
// share: its cores percentage plus SMBandPoints.
func (c Colocated) CheckEachWithin(cores int64) []string {
	var errs []string
	for i, p := range c.Each {
		if p > float64(cores)+SMBandPoints {
			errs = append(errs, fmt.Sprintf("client %d ran at %.1f %% of the whole GPU, above its %d %% (+%.0f points)", i+1, p, cores, SMBandPoints))
		}
	}
	return errs
}

// PriorityMargin is how much sooner, as a share of the low-priority
// client's time, the high-priority client of one server must finish the
// same work, both started together, for the priority to count as seen.
const PriorityMargin = 0.10

// PriorityOf compares a high- and a low-priority client started together
// at startMS: each one's time from the common start to its last
// repetition's end, and how much sooner the high one finished (a share of
// the low one's time; negative when it finished later).
func PriorityOf(high, low Timing, startMS float64) (highMS, lowMS, sooner float64) {
	highMS, lowMS = high.End-startMS, low.End-startMS
	return highMS, lowMS, (lowMS - highMS) / lowMS
}
