package gangbench

import (
	"container/heap"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"

	"github.com/gpulink/gpulink/driver/gang"
)

// Scale returns the jobs with arrivals rebased to 0 and compressed so that
// their GPU-seconds over the arrival window load gpus GPUs at load (1 =
// the cluster's capacity), and that window's length. Durations stay.
func Scale(jobs []Job, gpus int, load float64) ([]Job, float64) {
	out := slices.Clone(jobs)
	sort.SliceStable(out, func(a, b int) bool { return out[a].Submit < out[b].Submit })
	if len(out) == 0 {
		return out, 0
	}
	t0, t1 := out[0].Submit, out[len(out)-1].Submit
	work := 0.0
	for _, j := range out {
		work += float64(j.GPUs()) * j.Duration
	}
	span := t1 - t0
	if span <= 0 || work <= 0 || load <= 0 {
		return out, span
	}
	// window = work / (load × gpus); arrivals shrink by span / window.
	window := work / (load * float64(gpus))
	for i := range out {
		out[i].Submit = (out[i].Submit - t0) * window / span
	}
	return out, window
}

// Options tune a replay.
type Options struct {
	// PodTimeout is how long per-pod greedy holds a partly placed gang
	// before releasing it (kube-scheduler's gang Permit wait); default 300 s.
	PodTimeout float64
	// Backoff is how long a released gang's pods wait before they are
	// tried again (kube-scheduler's pod backoff, at most 10 s); default 10 s.
	Backoff float64
	// Required makes every gang require its minimal level (the lowest the
	// idle cluster allows for its size: one clique for up to 18 pods of 8
	// GPUs on NVL72): it waits until one domain of that level holds it.
	// Otherwise gangs are placed anywhere, as low as they fit.
	Required bool
	// History is how many of the last gangs to arrive gpulink's demand
	// counts (Request.Demand, through driver/gang's DemandHistory, as the
	// controller does); default 256, negative: none.
	History int
	// StarvationBound is the controller's --gang-starvation-bound, in
	// seconds, for the gpulink:starvationBound row (reserve.go); default
	// 900, the controller's default.
	StarvationBound float64
	// PreferredStarvationBound is the controller's
	// --gang-preferred-starvation-bound, in seconds: the bound of a gang
	// whose level is only preferred (every gang when Required is false);
	// default 4 h, the controller's default.
	PreferredStarvationBound float64
	// StrictReservationBound is the controller's
	// --gang-strict-reservation-bound, in seconds: until the holder has
	// waited this long its reservation is soft (reserve.go); default
	// 8 h, the controller's default; negative: strict from the start.
	StrictReservationBound float64
}

// Result is one replay's measures, over the arrival window.
type Result struct {
	Policy, Cluster, Workload string
	Load                      float64
	Seed                      uint64
	Jobs, Gangs               int
	// GangsPlaced are the gangs (jobs of several pods) started in the
	// window; GangsMinimal those of them on their minimal level (the
	// lowest the idle cluster allows for their size).
	GangsPlaced, GangsMinimal int
	// HeldIdle is the time-average of GPUs held by partly placed gangs;
	// HeldPeak its maximum.
	HeldIdle float64
	HeldPeak int
	// WaitGangs and WaitAll are mean queueing delays in seconds, a job
	// still waiting at the window's end counting its wait so far.
	WaitGangs, WaitAll float64
	// Util is the GPUs running jobs, time-averaged, over the cluster's.
	Util float64
}

type jobState struct {
	job      *Job
	start    float64
	reserved []int
	deadline float64
	retryAt  float64
}

type completion struct {
	end   float64
	nodes []int
	g     int
}

type completions []completion

func (c completions) Len() int           { return len(c) }
func (c completions) Less(a, b int) bool { return c[a].end < c[b].end }
func (c completions) Swap(a, b int)      { c[a], c[b] = c[b], c[a] }
func (c *completions) Push(x any)        { *c = append(*c, x.(completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// Replay runs jobs (scaled, sorted by Submit) on the cluster under policy
// until the end of the window and measures it. seed drives the policies'
// random choices only.
func Replay(c *Cluster, jobs []Job, window float64, policy string, seed uint64, opt Options) (Result, error) {
	if opt.PodTimeout == 0 {
		opt.PodTimeout = 300
	}
	if opt.Backoff == 0 {
		opt.Backoff = 10
	}
	if opt.History == 0 {
		opt.History = gang.DefaultDemandWindow
	}
	if opt.StarvationBound == 0 {
		opt.StarvationBound = DefaultStarvationBound
	}
	if opt.PreferredStarvationBound == 0 {
		opt.PreferredStarvationBound = DefaultPreferredStarvationBound
	}
	if opt.StrictReservationBound == 0 {
		opt.StrictReservationBound = DefaultStrictReservationBound
	}
	place := placerOf(policy)
	if place == nil && policy != PolicyPerPod {
		return Result{}, fmt.Errorf("policy %q: unknown (want one of %v)", policy, AllPolicies)
	}
	h := fnv.New64a()
	h.Write([]byte(policy))
	r := rand.New(rand.NewPCG(seed, h.Sum64()))
	s := newState(c)
	res := Result{Policy: policy, Cluster: c.Name}
	js := make([]jobState, len(jobs))
	var pending []int
	var done completions
	var t, busyInt, heldInt float64
	busy, held := 0, 0
	next := 0
	resv := reservation{holder: -1}
	var waitAll, waitGangs float64
	// gpulink's demand: the controller's history (driver/gang's
	// DemandHistory), the gangs recorded as they arrive.
	hist := gang.DemandHistory{Window: opt.History}
	start := func(x int) {
		st := &js[x]
		j := st.job
		st.start = t
		heap.Push(&done, completion{end: t + j.Duration, nodes: st.reserved, g: j.GPUsPerPod})
		busy += j.GPUs()
		w := t - j.Submit
		waitAll += w
		if j.Pods > 1 {
			waitGangs += w
			res.GangsPlaced++
			if c.Span(st.reserved) == c.MinLevel(j.Pods, j.GPUsPerPod) {
				res.GangsMinimal++
			}
		}
	}
	for {
		// The next event: an arrival, a completion or a gang's deadline.
		tn := math.Inf(1)
		if next < len(jobs) {
			tn = jobs[next].Submit
		}
		if len(done) > 0 {
			tn = min(tn, done[0].end)
		}
		for _, x := range pending {
			if js[x].deadline > 0 {
				tn = min(tn, js[x].deadline)
			}
			if js[x].retryAt > t {
				tn = min(tn, js[x].retryAt)
			}
		}
		if tn > window || math.IsInf(tn, 1) {
			break
		}
		busyInt += float64(busy) * (tn - t)
		heldInt += float64(held) * (tn - t)
		t = tn
		for len(done) > 0 && done[0].end <= t {
			d := heap.Pop(&done).(completion)
			for _, i := range d.nodes {
				s.give(i, d.g)
			}
			busy -= len(d.nodes) * d.g
		}
		arrived := false
		for next < len(jobs) && jobs[next].Submit <= t {
			js[next] = jobState{job: &jobs[next], start: -1}
			pending = append(pending, next)
			if j := &jobs[next]; j.Pods > 1 {
				hist.Record(strconv.Itoa(j.ID), j.Pods, j.GPUsPerPod)
				arrived = true
			}
			next++
		}
		if arrived && isGPULink(policy) && opt.History > 0 {
			s.demand = hist.Shapes()
		}
		switch {
		case policy == PolicyGPULinkReserving:
			pending = passReserving(s, js, pending, passArgs{place: place, opt: opt, r: r, start: start, t: t}, &resv)
		case place != nil:
			pending = passWhole(s, js, pending, place, opt.Required, r, start)
		default:
			pending = passPerPod(s, js, pending, r, t, opt, &held, start)
		}
		res.HeldPeak = max(res.HeldPeak, held)
	}
	busyInt += float64(busy) * (window - t)
	heldInt += float64(held) * (window - t)
	for _, x := range pending {
		w := window - js[x].job.Submit
		waitAll += w
		if js[x].job.Pods > 1 {
			waitGangs += w
		}
	}
	for _, j := range jobs {
		res.Jobs++
		if j.Pods > 1 {
			res.Gangs++
		}
	}
	if window > 0 {
		res.Util = busyInt / (window * float64(c.GPUs()))
		res.HeldIdle = heldInt / window
	}
	if res.Jobs > 0 {
		res.WaitAll = waitAll / float64(res.Jobs)
	}
	if res.Gangs > 0 {
		res.WaitGangs = waitGangs / float64(res.Gangs)
	}
	return res, nil
}

// passWhole tries the pending jobs in arrival order, each all or nothing
// (smaller jobs may pass a job that does not fit: backfill, the same for
// every policy). A job of g GPUs per pod that does not fit in the whole
// cluster's room is skipped without asking the policy, as are larger jobs
// of the same pod size after one fails.
func passWhole(s *state, js []jobState, pending []int, place placer, required bool, r *rand.Rand, start func(int)) []int {
	// failed[g][level] is the fewest pods of g GPUs that did not fit
	// within one domain of level in this pass: more do not fit either.
	top := s.c.H.Cluster()
	failed := make([][]int, GPUsPerNode+1)
	for g := range failed {
		failed[g] = make([]int, top+1)
		for lv := range failed[g] {
			failed[g][lv] = math.MaxInt
		}
	}
	keep := pending[:0]
	for _, x := range pending {
		j := js[x].job
		g := j.GPUsPerPod
		level := requiredLevel(s.c, j, required)
		if j.Pods >= failed[g][level] || s.slots(g) < j.Pods {
			failed[g][level] = min(failed[g][level], j.Pods)
			keep = append(keep, x)
			continue
		}
		nodes := place(s, j, level, r)
		if nodes == nil {
			failed[g][level] = min(failed[g][level], j.Pods)
			keep = append(keep, x)
			continue
		}
		for _, i := range nodes {
			s.take(i, g)
		}
		js[x].reserved = nodes
		start(x)
	}
	return keep
}

// passPerPod is kube-scheduler's gang scheduling pod by pod: each pending
// pod, in arrival order, is bound to the node with the most free GPUs
// (LeastAllocated; ties at random) as soon as one has room (with a
// required level, pods after the first only in the first one's domain of
// that level, as a required pod affinity does), and waits
// there holding its GPUs until every pod of its gang has a node; a gang
// not complete within PodTimeout of its first pod releases them all, and
// its pods back off before they are tried again.
func passPerPod(s *state, js []jobState, pending []int, r *rand.Rand, t float64, opt Options, held *int, start func(int)) []int {
	for _, x := range pending {
		st := &js[x]
		if st.deadline > 0 && t >= st.deadline {
			for _, i := range st.reserved {
				s.give(i, st.job.GPUsPerPod)
			}
			*held -= len(st.reserved) * st.job.GPUsPerPod
			st.reserved, st.deadline, st.retryAt = nil, 0, t+opt.Backoff
		}
	}
	minFail := GPUsPerNode + 1
	keep := pending[:0]
	for _, x := range pending {
		st := &js[x]
		j := st.job
		g := j.GPUsPerPod
		if t < st.retryAt || g >= minFail {
			keep = append(keep, x)
			continue
		}
		level := s.c.H.Cluster()
		if opt.Required && j.Pods > 1 {
			level = s.c.MinLevel(j.Pods, g)
		}
		for len(st.reserved) < j.Pods {
			var i int
			if len(st.reserved) > 0 && level < s.c.H.Cluster() {
				// Pod affinity to the gang's first pod at the level.
				i = s.leastAllocatedIn(s.c.sameDomain(st.reserved[0], level), g, r)
				if i < 0 {
					break
				}
			} else if i = s.leastAllocated(g, r); i < 0 {
				minFail = g
				break
			}
			s.take(i, g)
			st.reserved = append(st.reserved, i)
			*held += g
		}
		if len(st.reserved) == j.Pods {
			*held -= j.GPUs()
			st.deadline = 0
			start(x)
			continue
		}
		if len(st.reserved) > 0 && st.deadline == 0 {
			st.deadline = t + opt.PodTimeout
		}
		keep = append(keep, x)
	}
	return keep
}
