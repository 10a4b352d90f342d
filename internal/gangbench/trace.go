// Package gangbench replays multi-node jobs (gangs) on simulated clusters
// of 8-GPU nodes in NVLink domains, leaves and spines, placed by gpulink's
// gang placement (driver/gang) and by baselines written from their
// descriptions: per-pod greedy (kube-scheduler's gang scheduling), Kueue
// TAS's best fit, Volcano's HyperNode tiers and random. It backs `gpulink
// simulate --gang-trace` and docs/performance/gangs.md (issue 31, §4).
package gangbench

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// KalosFile is the Kalos job list inside the gang trace directory.
const KalosFile = "kalos_jobs.csv"

// ErrNoTrace says the trace directory or file is absent.
var ErrNoTrace = errors.New("gang trace not found")

// Job is one multi-node job: Pods pods of GPUsPerPod GPUs each, submitted
// at Submit seconds, running Duration seconds once all pods run.
type Job struct {
	ID         int
	Submit     float64
	Duration   float64
	Pods       int
	GPUsPerPod int
}

// GPUs is the job's GPU count.
func (j *Job) GPUs() int { return j.Pods * j.GPUsPerPod }

// LoadKalos reads dir/kalos_jobs.csv (job_id, submit_time_s, duration_s,
// num_pods, gpus_per_pod), at run time: the trace is never copied into the
// project. A missing file is ErrNoTrace, naming the path.
func LoadKalos(dir string) ([]Job, error) {
	path := filepath.Join(dir, KalosFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoTrace, path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseKalos(f, path)
}

func parseKalos(r io.Reader, path string) ([]Job, error) {
	cr := csv.NewReader(r)
	rows, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%s: no jobs", path)
	}
	want := []string{"job_id", "submit_time_s", "duration_s", "num_pods", "gpus_per_pod"}
	for i, c := range want {
		if i >= len(rows[0]) || rows[0][i] != c {
			return nil, fmt.Errorf("%s: header %v, want %v", path, rows[0], want)
		}
	}
	jobs := make([]Job, 0, len(rows)-1)
	for n, row := range rows[1:] {
		var v [5]float64
		for i := range v {
			x, err := strconv.ParseFloat(row[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: line %d: column %s %q: %w", path, n+2, want[i], row[i], err)
			}
			v[i] = x
		}
		j := Job{ID: int(v[0]), Submit: v[1], Duration: v[2], Pods: int(v[3]), GPUsPerPod: int(v[4])}
		if j.Pods < 1 || j.GPUsPerPod < 1 || j.GPUsPerPod > 8 || j.Duration < 0 {
			return nil, fmt.Errorf("%s: line %d: pods %d, gpus_per_pod %d, duration %g: out of range", path, n+2, j.Pods, j.GPUsPerPod, j.Duration)
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// spotWorkers is the published job-size distribution of Alibaba's spot GPU
// trace (466,867 jobs; gangs/README.md): share of jobs per workers-per-job
// range, in basis points.
var spotWorkers = []struct {
	lo, hi int
	bp     int
}{{1, 1, 9159}, {2, 2, 281}, {3, 4, 211}, {5, 8, 161}, {9, 16, 90}, {17, 64, 84}, {65, 332, 13}}

// spotGPUSeconds is its share of GPU-seconds per workers-per-job range
// (per mille): 1 → 72.2 %, 2-8 → 9.5 %, 9-32 → 9.8 %, 33-128 → 7.7 %,
// 129+ → 0.7 %.
var spotGPUSeconds = []struct {
	lo, hi int
	pm     int
}{{1, 1, 722}, {2, 8, 95}, {9, 32, 98}, {33, 128, 77}, {129, 1 << 30, 7}}

// Spot draws n jobs from the spot trace's published distribution, the
// shapes the Kalos jobs do not give it from the Kalos jobs (the spot table
// has no GPUs per worker nor durations): workers per job from the
// published shares (uniform within a range), GPUs per pod from the Kalos
// jobs of the same kind (one pod: 1, 2 or 8 as there; several: 8), a
// duration drawn from the Kalos jobs of the same kind and then scaled per
// GPU-second range so that the draw's GPU-seconds split as the spot
// trace's do, and arrivals a Poisson process of rate 1 (Scale sets the
// load). The draws depend on seed only.
func Spot(kalos []Job, n int, seed uint64) []Job {
	r := rand.New(rand.NewPCG(seed, 0x5907))
	var singleG, singleD, multiD []float64
	for _, j := range kalos {
		if j.Pods == 1 {
			singleG = append(singleG, float64(j.GPUsPerPod))
			singleD = append(singleD, j.Duration)
		} else {
			multiD = append(multiD, j.Duration)
		}
	}
	if len(singleG) == 0 || len(multiD) == 0 {
		return nil
	}
	jobs := make([]Job, n)
	t := 0.0
	for i := range jobs {
		x := r.IntN(10000)
		b := spotWorkers[len(spotWorkers)-1]
		for _, w := range spotWorkers {
			if x < w.bp {
				b = w
				break
			}
			x -= w.bp
		}
		pods := b.lo + r.IntN(b.hi-b.lo+1)
		j := Job{ID: i, Submit: t, Pods: pods, GPUsPerPod: 8}
		if pods == 1 {
			k := r.IntN(len(singleG))
			j.GPUsPerPod, j.Duration = int(singleG[k]), singleD[k]
		} else {
			j.Duration = multiD[r.IntN(len(multiD))]
		}
		j.Duration = max(j.Duration, 1)
		jobs[i] = j
		t += r.ExpFloat64()
	}
	// Scale durations per GPU-second range to the published split.
	got := make([]float64, len(spotGPUSeconds))
	total := 0.0
	rangeOf := func(pods int) int {
		for k, g := range spotGPUSeconds {
			if pods >= g.lo && pods <= g.hi {
				return k
			}
		}
		return len(spotGPUSeconds) - 1
	}
	for _, j := range jobs {
		gs := float64(j.GPUs()) * j.Duration
		got[rangeOf(j.Pods)] += gs
		total += gs
	}
	wanted := 0
	for k, g := range spotGPUSeconds {
		if got[k] > 0 {
			wanted += g.pm
		}
	}
	for i := range jobs {
		k := rangeOf(jobs[i].Pods)
		jobs[i].Duration *= total * float64(spotGPUSeconds[k].pm) / float64(wanted) / got[k]
	}
	return jobs
}

// Jitter returns the jobs with each arrival moved by up to one mean
// inter-arrival gap either way (uniform, from seed): replays of one trace
// that differ the way two weeks of the same cluster do, so that a
// deterministic policy's result gets a spread across seeds.
func Jitter(jobs []Job, seed uint64) []Job {
	out := make([]Job, len(jobs))
	copy(out, jobs)
	if len(out) < 2 {
		return out
	}
	lo, hi := out[0].Submit, out[0].Submit
	for _, j := range out {
		lo, hi = min(lo, j.Submit), max(hi, j.Submit)
	}
	gap := (hi - lo) / float64(len(out)-1)
	r := rand.New(rand.NewPCG(seed, 0x7177))
	for i := range out {
		out[i].Submit = max(lo, out[i].Submit+(2*r.Float64()-1)*gap)
	}
	return out
}

// Mixed is the Kalos jobs with a spot draw laid over the same span: the
// spot jobs' arrivals stretched to the Kalos jobs' and their durations
// scaled so that both bring the same GPU-seconds. Kalos's large
// pre-training gangs then share the cluster with the singles and small
// gangs of a shared cluster.
func Mixed(kalos, spot []Job) []Job {
	if len(kalos) == 0 || len(spot) == 0 {
		return append(slices.Clone(kalos), spot...)
	}
	work := func(js []Job) (w, lo, hi float64) {
		lo, hi = js[0].Submit, js[0].Submit
		for _, j := range js {
			w += float64(j.GPUs()) * j.Duration
			lo, hi = min(lo, j.Submit), max(hi, j.Submit)
		}
		return w, lo, hi
	}
	kw, klo, khi := work(kalos)
	sw, slo, shi := work(spot)
	out := slices.Clone(kalos)
	for _, j := range spot {
		if shi > slo {
			j.Submit = klo + (j.Submit-slo)*(khi-klo)/(shi-slo)
		}
		j.Duration *= kw / sw
		j.ID += len(kalos)
		out = append(out, j)
	}
	return out
}
