package tracebench

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
)

// Options configure a replay.
type Options struct {
	// TopologyDir holds the topology files nodes are mapped to
	// (driver/topology/testdata).
	TopologyDir string
	// Seeds are the Monte-Carlo repetitions; each draws its own task
	// sequence, the same for every policy.
	Seeds []uint64
	// Policies to replay (AllPolicies when empty).
	Policies []string
	// MaxPercent is how far arrivals go, in % of the cluster's GPU
	// capacity (130 when 0); StepPercent the report step (10 when 0).
	MaxPercent, StepPercent int
	// NodeStride keeps every NodeStride-th node only (1 or 0: all), for
	// quick runs: arrivals are measured against the kept capacity.
	NodeStride int
	// Workers run (seed, policy) replays in parallel (1 when 0).
	Workers int
	// IgnoreMemory replays as the paper's simulator does: no task's
	// memory is counted, by any policy, in the fit or the fragment.
	IgnoreMemory bool
	// RecordPlacements keeps each task's node in Run.Placements (for the
	// replay through the real controller, which compares task by task).
	RecordPlacements bool
	// Failures, when set, gets one line per task a policy could not
	// place, with the state of the nodes it may run on (failures.go),
	// from every seed and policy, in no fixed order; the caller writes
	// FailureHeader first.
	Failures io.Writer
	// EndState, when set, gets each replay's end state, one line per
	// GPU model (endstate.go), in no fixed order of the replays; the
	// caller writes EndStateHeader first.
	EndState io.Writer
}

// replayLogs are the logs every replay of a Replay writes to (nil: not
// asked for).
type replayLogs struct {
	failures, endState *tsvLog
}

func (o *Options) defaults() {
	if len(o.Policies) == 0 {
		o.Policies = AllPolicies
	}
	if o.MaxPercent == 0 {
		o.MaxPercent = 130
	}
	if o.StepPercent == 0 {
		o.StepPercent = 10
	}
	if o.NodeStride < 1 {
		o.NodeStride = 1
	}
	if o.Workers < 1 {
		o.Workers = 1
	}
}

// Step is the state of one replay when arrivals first reach a step.
type Step struct {
	// Percent is the step, in % of GPU capacity arrived.
	Percent int
	// Arrived, Failed and Idle are milli GPUs: requested by the tasks
	// drawn so far, requested by those of them that could not be placed,
	// and not allocated in the cluster.
	Arrived, Failed, Idle int64
	// Frag is the cluster's fragmentation (milli GPUs, frag.go).
	Frag float64
	// FailedTasks counts tasks not placed (CPU-only ones included).
	FailedTasks int
	// Multi counts multi-GPU tasks placed, Ideal those of them whose
	// weakest link is the best the node offers a set of that size idle.
	Multi, Ideal int
}

// Run is one (seed, policy) replay.
type Run struct {
	Seed   uint64
	Policy string
	Steps  []Step
	// Capacity is the cluster's GPU capacity in milli GPUs.
	Capacity int64
	Tasks    int
	// Placements is each task's node, by index among the replayed nodes,
	// -1 when it was not placed (Options.RecordPlacements only).
	Placements []int
}

// ListResult is every run of one task list.
type ListResult struct {
	List     string
	Nodes    int
	GPUs     int
	Classes  int
	Policies []string
	Seeds    []uint64
	Runs     []Run // by seed, then policy in Policies order
}

// sequence draws tasks uniformly with replacement until their GPU
// requests reach limit milli GPUs: the paper's workload inflation.
func sequence(tasks []Task, limit int64, seed uint64, list string) []int {
	h := fnv.New64a()
	h.Write([]byte(list))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	var seq []int
	var arrived int64
	for arrived < limit {
		i := rng.IntN(len(tasks))
		seq = append(seq, i)
		arrived += tasks[i].TotalMilli()
	}
	return seq
}

// Replay runs every policy over every seed on one task list.
func Replay(tr *Trace, opt Options) (*ListResult, error) {
	opt.defaults()
	if opt.IgnoreMemory {
		tasks := slices.Clone(tr.Tasks)
		for i := range tasks {
			tasks[i].MemoryMiB = 0
		}
		tr = &Trace{Nodes: tr.Nodes, Tasks: tasks, List: tr.List}
	}
	var nodes []Node
	for i := 0; i < len(tr.Nodes); i += opt.NodeStride {
		nodes = append(nodes, tr.Nodes[i])
	}
	ks := newKindSet(opt.TopologyDir)
	// Build every kind once up front: kinds are shared, read-only, by the
	// parallel replays.
	probe, err := newCluster(nodes, ks)
	if err != nil {
		return nil, err
	}
	if probe.capMilli == 0 {
		return nil, fmt.Errorf("trace %s: the nodes have no GPUs", tr.List)
	}
	hasGPUTask := false
	for i := range tr.Tasks {
		hasGPUTask = hasGPUTask || tr.Tasks[i].GPUs > 0
	}
	if !hasGPUTask {
		return nil, fmt.Errorf("trace %s: no task asks for a GPU, arrivals would never grow", tr.List)
	}
	for _, p := range opt.Policies {
		if _, err := newPolicy(p, nil, nil); err != nil {
			return nil, err
		}
	}
	res := &ListResult{List: tr.List, Nodes: len(nodes), GPUs: int(probe.capMilli / MilliPerGPU),
		Policies: opt.Policies, Seeds: opt.Seeds, Runs: make([]Run, len(opt.Seeds)*len(opt.Policies))}
	limit := probe.capMilli * int64(opt.MaxPercent) / 100
	seqs := make([][]int, len(opt.Seeds))
	for i, s := range opt.Seeds {
		seqs[i] = sequence(tr.Tasks, limit, s, tr.List)
	}
	res.Classes = NewWorkload(tr.Tasks).Classes()

	logs := replayLogs{failures: newTSVLog(opt.Failures), endState: newTSVLog(opt.EndState)}
	type job struct{ si, pi int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				r, err := replayOne(tr, nodes, ks, seqs[j.si], opt.Seeds[j.si], opt.Policies[j.pi], opt, logs)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				res.Runs[j.si*len(opt.Policies)+j.pi] = r
				mu.Unlock()
			}
		}()
	}
	for si := range opt.Seeds {
		for pi := range opt.Policies {
			jobs <- job{si, pi}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := cmp.Or(logs.failures.failed("failure log"), logs.endState.failed("end-state log")); err != nil {
		return nil, err
	}
	return res, nil
}

// replayOne places seq under one policy on a fresh cluster.
func replayOne(tr *Trace, nodes []Node, ks *kindSet, seq []int, seed uint64, name string, opt Options, logs replayLogs) (Run, error) {
	c, err := newCluster(nodes, ks)
	if err != nil {
		return Run{}, err
	}
	// Each replay has its own workload (its memo of model access) and
	// its own tie-breaking stream, derived from the seed and the policy.
	w := NewWorkload(tr.Tasks)
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	pol, err := newPolicy(name, w, rng)
	if err != nil {
		return Run{}, err
	}
	run := Run{Seed: seed, Policy: name, Capacity: c.capMilli, Tasks: len(seq)}
	var arrived, failed int64
	failedTasks, multi, ideal := 0, 0, 0
	next := opt.StepPercent
	for si, ti := range seq {
		t := &tr.Tasks[ti]
		arrived += t.TotalMilli()
		p, ok, err := pol.place(c, t)
		if err != nil {
			return Run{}, fmt.Errorf("%s, seed %d: %w", name, seed, err)
		}
		if opt.RecordPlacements {
			node := -1
			if ok {
				node = p.Node
			}
			run.Placements = append(run.Placements, node)
		}
		if ok {
			if err := c.apply(t, p); err != nil {
				return Run{}, fmt.Errorf("%s, seed %d: %w", name, seed, err)
			}
			if t.GPUs >= 2 {
				multi++
				n := c.nodes[p.Node]
				if weakest(n, p.GPUs) >= n.kind.ideal[t.GPUs] {
					ideal++
				}
			}
		} else {
			failed += t.TotalMilli()
			failedTasks++
			if logs.failures != nil {
				rec := describeFailure(c, t)
				rec.List, rec.Seed, rec.Policy, rec.Index = tr.List, seed, name, si
				rec.ArrivedPct = 100 * float64(arrived) / float64(c.capMilli)
				logs.failures.write(rec.row())
			}
		}
		for next <= opt.MaxPercent && arrived*100 >= c.capMilli*int64(next) {
			frag, idle := w.clusterFrag(c)
			run.Steps = append(run.Steps, Step{Percent: next, Arrived: arrived, Failed: failed, Idle: idle, Frag: frag,
				FailedTasks: failedTasks, Multi: multi, Ideal: ideal})
			next += opt.StepPercent
		}
	}
	if logs.endState != nil {
		rows := endState(c)
		lines := make([]string, len(rows))
		for i := range rows {
			rows[i].List, rows[i].Seed, rows[i].Policy = tr.List, seed, name
			lines[i] = rows[i].row()
		}
		// One replay's lines stay together.
		logs.endState.write(lines...)
	}
	return run, nil
}

// Summary is a statistic over seeds at one step for one policy.
type Summary struct {
	// Unalloc is the GPU requests that could not be allocated, in % of
	// the cluster's GPU capacity: mean and standard deviation over seeds.
	Unalloc, UnallocSD float64
	// FragRate is fragmentation over unallocated GPU, in %, mean over seeds.
	FragRate float64
	// Idle is the cluster's unallocated GPU in % of capacity.
	Idle float64
	// IdealShare is the share of placed multi-GPU tasks on their ideal
	// link class (NaN when none was placed); Multi their mean count.
	IdealShare float64
	Multi      float64
}

// Summarize averages the runs of policy at step index si over seeds.
func (r *ListResult) Summarize(policy string, si int) Summary {
	var u, u2, fr, idle, multi, ideal float64
	n := 0
	for _, run := range r.Runs {
		if run.Policy != policy || si >= len(run.Steps) {
			continue
		}
		s := run.Steps[si]
		cp := float64(run.Capacity)
		x := 100 * float64(s.Failed) / cp
		u += x
		u2 += x * x
		if s.Idle > 0 {
			fr += 100 * s.Frag / float64(s.Idle)
		}
		idle += 100 * float64(s.Idle) / cp
		multi += float64(s.Multi)
		ideal += float64(s.Ideal)
		n++
	}
	if n == 0 {
		return Summary{Unalloc: math.NaN(), FragRate: math.NaN(), IdealShare: math.NaN()}
	}
	fn := float64(n)
	out := Summary{Unalloc: u / fn, FragRate: fr / fn, Idle: idle / fn, Multi: multi / fn, IdealShare: math.NaN()}
	out.UnallocSD = math.Sqrt(math.Max(0, u2/fn-out.Unalloc*out.Unalloc))
	if multi > 0 {
		out.IdealShare = ideal / multi
	}
	return out
}

// StepPercents lists the steps the runs recorded.
func (r *ListResult) StepPercents() []int {
	if len(r.Runs) == 0 {
		return nil
	}
	var out []int
	for _, s := range r.Runs[0].Steps {
		out = append(out, s.Percent)
	}
	return out
}
