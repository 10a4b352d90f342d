package gangbench

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const traceDir = "../../../shared/traces/gangs"

func TestLoadKalosTrace(t *testing.T) {
	jobs, err := LoadKalos(traceDir)
	if errors.Is(err, ErrNoTrace) {
		t.Skipf("no gang trace at %s: %v", filepath.Join(traceDir, KalosFile), err)
	}
	if err != nil {
		t.Fatal(err)
	}
	gangs := 0
	for _, j := range jobs {
		if j.Pods > 1 {
			gangs++
		}
	}
	// gangs/README.md: 319 jobs, 89 of them of one pod.
	if len(jobs) != 319 || gangs != 319-89 {
		t.Fatalf("%d jobs, %d gangs; the README says 319 and 230", len(jobs), gangs)
	}
}

func TestLoadKalosMissing(t *testing.T) {
	_, err := LoadKalos(t.TempDir())
	if !errors.Is(err, ErrNoTrace) || !strings.Contains(err.Error(), KalosFile) {
		t.Fatalf("got %v, want ErrNoTrace naming %s", err, KalosFile)
	}
}

func TestParseKalosErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a,b\n1,2\n", "header"},
		{"job_id,submit_time_s,duration_s,num_pods,gpus_per_pod\n0,0,10,x,8\n", `num_pods "x"`},
		{"job_id,submit_time_s,duration_s,num_pods,gpus_per_pod\n0,0,10,2,9\n", "gpus_per_pod 9"},
	} {
		if _, err := parseKalos(strings.NewReader(tc.in), "t.csv"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error naming %s", tc.in, err, tc.want)
		}
	}
}

// kalosLike is a stand-in for the Kalos jobs (the trace is not copied into
// the project): singles of 1, 2 and 8 GPUs and gangs of 8-GPU pods.
func kalosLike() []Job {
	var jobs []Job
	for i := range 60 {
		j := Job{ID: i, Submit: float64(i * 100), Duration: float64(50 + 37*(i%11)), Pods: 1, GPUsPerPod: []int{1, 2, 8}[i%3]}
		if i%2 == 1 {
			j.Pods, j.GPUsPerPod, j.Duration = []int{2, 4, 8, 16, 32, 64}[i%6], 8, float64(300+900*(i%7))
		}
		jobs = append(jobs, j)
	}
	return jobs
}

func TestSpotFollowsThePublishedShares(t *testing.T) {
	jobs := Spot(kalosLike(), 20000, 7)
	singles, total := 0.0, 0.0
	gs := make([]float64, len(spotGPUSeconds))
	for _, j := range jobs {
		if j.Pods == 1 {
			singles++
		}
		for k, r := range spotGPUSeconds {
			if j.Pods >= r.lo && j.Pods <= r.hi {
				gs[k] += float64(j.GPUs()) * j.Duration
			}
		}
		total += float64(j.GPUs()) * j.Duration
		if j.Pods > 332 || j.Pods < 1 {
			t.Fatalf("job of %d pods", j.Pods)
		}
	}
	if share := singles / float64(len(jobs)); math.Abs(share-0.9159) > 0.01 {
		t.Errorf("single-pod share %.4f, published 0.9159", share)
	}
	for k, r := range spotGPUSeconds {
		if got := gs[k] / total; math.Abs(got-float64(r.pm)/1000) > 0.001 {
			t.Errorf("GPU-seconds of %d-%d workers: %.4f, published %.3f", r.lo, r.hi, got, float64(r.pm)/1000)
		}
	}
}

func TestScaleLoad(t *testing.T) {
	jobs, window := Scale(kalosLike(), 1024, 0.5)
	work := 0.0
	for _, j := range jobs {
		work += float64(j.GPUs()) * j.Duration
	}
	if got := work / (window * 1024); math.Abs(got-0.5) > 1e-9 {
		t.Fatalf("offered load %.3f, want 0.5", got)
	}
	if jobs[0].Submit != 0 || math.Abs(jobs[len(jobs)-1].Submit-window) > 1e-6 {
		t.Fatalf("arrivals span %g..%g, window %g", jobs[0].Submit, jobs[len(jobs)-1].Submit, window)
	}
}

// TestDeadlockPerPod: two gangs of 48 pods arrive together on 64 nodes.
// Per-pod greedy interleaves their pods, each gang holds part of the
// cluster idle until its timeout; all-or-nothing policies run one, then
// the other, and hold nothing idle.
func TestDeadlockPerPod(t *testing.T) {
	c := SuperPOD(64)
	jobs := []Job{{ID: 0, Submit: 0, Duration: 1000, Pods: 48, GPUsPerPod: 8}, {ID: 1, Submit: 0, Duration: 1000, Pods: 48, GPUsPerPod: 8}, {ID: 2, Submit: 5000, Duration: 1, Pods: 1, GPUsPerPod: 1}}
	for _, p := range AllPolicies {
		res, err := Replay(c, jobs, 5000, p, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if p == PolicyPerPod {
			if res.HeldPeak == 0 || res.HeldIdle == 0 {
				t.Errorf("%s: held %v GPUs idle (peak %d), want some", p, res.HeldIdle, res.HeldPeak)
			}
			continue
		}
		if res.HeldPeak != 0 || res.GangsPlaced != 2 {
			t.Errorf("%s: %d gangs placed, %d GPUs held idle at peak; want 2 and 0", p, res.GangsPlaced, res.HeldPeak)
		}
	}
}

// TestReplayLevels: on an idle SuperPOD-style cluster a 32-pod gang fits a
// leaf; gpulink and Kueue put it there, random almost never does.
func TestReplayLevels(t *testing.T) {
	c := SuperPOD(256)
	jobs := []Job{{ID: 0, Submit: 0, Duration: 10, Pods: 20, GPUsPerPod: 8}, {ID: 1, Submit: 1, Duration: 10, Pods: 32, GPUsPerPod: 8}, {ID: 2, Submit: 2, Duration: 10, Pods: 64, GPUsPerPod: 8}}
	for _, p := range []string{PolicyGPULink, PolicyKueue, PolicyVolcano} {
		res, err := Replay(c, jobs, 2, p, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if res.GangsPlaced != 3 || res.GangsMinimal != 3 {
			t.Errorf("%s: %d placed, %d on their minimal level; want 3 and 3", p, res.GangsPlaced, res.GangsMinimal)
		}
	}
	if got := c.MinLevel(32, 8); c.H.Name(got) != "leaf" {
		t.Fatalf("MinLevel(32, 8) = %s, want leaf", c.H.Name(got))
	}
	if got := c.MinLevel(33, 8); c.H.Name(got) != "spine" {
		t.Fatalf("MinLevel(33, 8) = %s, want spine", c.H.Name(got))
	}
	if got := NVL72(2016).MinLevel(18, 8); got != 1 {
		t.Fatalf("NVL72 MinLevel(18, 8) = %d, want 1 (clique)", got)
	}
}

// TestKueueDescent checks the Kueue baseline as described: the fitting
// domain with the least room, then the largest children first and the
// last one best fit.
func TestKueueDescent(t *testing.T) {
	c := SuperPOD(256) // leaves of 32 nodes, one spine
	s := newState(c)
	// leaf-000: 10 free nodes, leaf-001: 12, leaf-002: 32, others full.
	for i := range 256 {
		leaf := i / 32
		free := leaf == 2 || leaf == 0 && i%32 < 10 || leaf == 1 && i%32 < 12
		if !free {
			s.take(i, 8)
		}
	}
	got := placeKueue(s, &Job{Pods: 11, GPUsPerPod: 8}, c.H.Cluster(), nil)
	if len(got) != 11 || got[0]/32 != 1 {
		t.Fatalf("11 pods: nodes %v, want leaf-001 (best fit)", got)
	}
	got = placeKueue(s, &Job{Pods: 40, GPUsPerPod: 8}, c.H.Cluster(), nil)
	leaves := map[int]int{}
	for _, i := range got {
		leaves[i/32]++
	}
	// Leaves: largest first, leaf-002 whole (32), then 8 best fit on
	// leaf-000 (10); then, as Kueue's descent does, the nodes of both are
	// sorted together (all of room 1, by name) and the first 40 taken:
	// leaf-000's 10 and 30 of leaf-002.
	if len(got) != 40 || leaves[0] != 10 || leaves[2] != 30 {
		t.Fatalf("40 pods: per leaf %v, want 10 on leaf-000 and 30 on leaf-002", leaves)
	}
	// gpulink: the fewest leaves, leaf-002 used up and the rest on the
	// best fit, leaf-000, and it keeps those counts down to the nodes.
	gl := placeGPULink(s, &Job{Pods: 40, GPUsPerPod: 8}, c.H.Cluster(), nil)
	leaves = map[int]int{}
	for _, i := range gl {
		leaves[i/32]++
	}
	if len(gl) != 40 || leaves[2] != 32 || leaves[0] != 8 {
		t.Fatalf("gpulink 40 pods: per leaf %v, want 32 on leaf-002 and 8 on leaf-000", leaves)
	}
}

func TestMain(m *testing.M) {
	os.Exit(m.Run())
}

// TestPaired: the difference is taken per seed (matched by seed, not by
// position), judged beyond noise only past NoiseSE standard errors with
// MinPairedSeeds seeds, in the measure's direction.
func TestPaired(t *testing.T) {
	cell := func(placed []int, wait []float64, seeds []uint64) *Cell {
		c := &Cell{}
		for i := range placed {
			c.Runs = append(c.Runs, Result{Seed: seeds[i], Gangs: 100, GangsPlaced: placed[i], WaitGangs: wait[i]})
		}
		return c
	}
	seeds := func(n int) []uint64 {
		s := make([]uint64, n)
		for i := range s {
			s[i] = uint64(i + 1)
		}
		return s
	}
	rep := func(x, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = x + i%2 // a spread of 1 over seeds
		}
		return out
	}
	waits := func(x float64, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = x + float64(7*i)
		}
		return out
	}
	placed, wait := PairedMeasures[0], PairedMeasures[3]
	for _, tc := range []struct {
		name string
		a, b *Cell
		m    PairedMeasure
		mean float64
		want Verdict
	}{
		{"same every seed: level", cell(rep(90, 10), waits(0, 10), seeds(10)), cell(rep(90, 10), waits(0, 10), seeds(10)), placed, 0, Level},
		{"2 points more every seed: ahead", cell(rep(92, 10), waits(0, 10), seeds(10)), cell(rep(90, 10), waits(0, 10), seeds(10)), placed, 2, Ahead},
		{"too few seeds: level", cell(rep(92, 9), waits(0, 9), seeds(9)), cell(rep(90, 9), waits(0, 9), seeds(9)), placed, 2, Level},
		{"longer wait: behind", cell(rep(90, 10), waits(100, 10), seeds(10)), cell(rep(90, 10), waits(0, 10), seeds(10)), wait, 100, Behind},
		{"shorter wait: ahead", cell(rep(90, 10), waits(0, 10), seeds(10)), cell(rep(90, 10), waits(100, 10), seeds(10)), wait, -100, Ahead},
		{"one seed off, rest equal: within noise", cell([]int{90, 90, 90, 90, 90, 90, 90, 90, 90, 99}, waits(0, 10), seeds(10)), cell(rep(90, 10), waits(0, 10), seeds(10)), placed, 0.4, Level},
	} {
		d := Paired(tc.a, tc.b, tc.m)
		if math.Abs(d.Mean-tc.mean) > 0.05 || d.Verdict != tc.want {
			t.Errorf("%s: mean %.2f ± %.2f %q, want %.2f %q", tc.name, d.Mean, d.SE, d.Verdict, tc.mean, tc.want)
		}
	}
	// Seeds are matched by Result.Seed: b's runs in reverse order give
	// the same difference.
	a, b := cell([]int{91, 95}, waits(0, 2), []uint64{1, 2}), cell([]int{95, 90}, waits(0, 2), []uint64{2, 1})
	if d := Paired(a, b, placed); d.N != 2 || d.Mean != 0.5 {
		t.Errorf("matched by seed: mean %.2f over %d, want 0.5 over 2 (1 then 0)", d.Mean, d.N)
	}
}

// TestGPULinkSingleAsController: a single pod is placed as the
// controller's planner does, not through driver/gang: the node with the
// fewest free GPUs that holds it, then the first by the controller's tie
// key (leaf-000 before leaf-001), even where driver/gang would take a
// node of the busiest leaf.
func TestGPULinkSingleAsController(t *testing.T) {
	c := SuperPOD(64) // leaf-000: nodes 0-31, leaf-001: 32-63
	s := newState(c)
	for i := 32; i < 63; i++ {
		s.take(i, 8) // leaf-001 busy but node 63
	}
	s.take(5, 6) // node 5: 2 free
	s.take(7, 4) // node 7: 4 free
	for _, tc := range []struct {
		g, want int
	}{{2, 5}, {3, 7}, {8, 0}} {
		got := placeGPULink(s, &Job{Pods: 1, GPUsPerPod: tc.g}, c.H.Cluster(), nil)
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%d GPUs: node %v, want %d", tc.g, got, tc.want)
		}
	}
}

// TestGPULinkSingleFillsDomainsWhateverTheNames: with node names in the
// reverse of the topology (leaf-001's nodes named first), equal nodes are
// still taken leaf by leaf, as the controller's tie keys order them; and
// the replay's clusters are named in that order, so their node order is
// the tie keys'.
func TestGPULinkSingleFillsDomainsWhateverTheNames(t *testing.T) {
	c := SuperPOD(64)
	for i := range c.Nodes {
		c.Nodes[i].Name = fmt.Sprintf("n-%04d", len(c.Nodes)-1-i)
	}
	c.rankTieKeys()
	s := newState(c)
	// Within leaf-000 (nodes 0-31) the names decide: n-0032 (node 31)
	// first.
	for k := range 3 {
		got := placeGPULink(s, &Job{Pods: 1, GPUsPerPod: 8}, c.H.Cluster(), nil)
		if want := 31 - k; len(got) != 1 || got[0] != want {
			t.Fatalf("single %d: node %v, want %d (leaf-000 first, whatever the names, then by name)", k, got, want)
		}
		s.take(got[0], 8)
	}
	for _, c := range []*Cluster{SuperPOD(2048), NVL72(2088)} {
		for i, r := range c.tieRank {
			if r != i {
				t.Fatalf("%s: node %d (%s) has tie rank %d, want its index", c.Name, i, c.Nodes[i].Name, r)
			}
		}
	}
}

// TestFmtDiff: a verdict is never printed beside a difference that rounds
// to zero.
func TestFmtDiff(t *testing.T) {
	for _, tc := range []struct {
		d    Diff
		want string
	}{
		{Diff{Mean: 0, SE: 0}, "+0.0 ± 0.0"},
		{Diff{Mean: 0.03, SE: 0.01, Verdict: Ahead}, "+0.03 ± 0.01 **ahead**"},
		{Diff{Mean: -1.26, SE: 0.4, Verdict: Behind}, "-1.3 ± 0.4 **behind**"},
		{Diff{Mean: -412.4, SE: 120.2, Verdict: Ahead}, "-412 ± 120 **ahead**"},
		{Diff{Mean: math.NaN()}, "–"},
	} {
		if got := fmtDiff(tc.d); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.d, got, tc.want)
		}
	}
}
