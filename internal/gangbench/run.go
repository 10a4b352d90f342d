package gangbench

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// Workload names.
const (
	WorkloadKalos = "kalos"
	WorkloadSpot  = "spot"
	WorkloadMixed = "mixed"
)

// Modes: gangs anywhere as low as they fit, or each gang requiring its
// minimal level.
const (
	ModePreferred = "preferred"
	ModeRequired  = "required"
)

// Config is a replay matrix.
type Config struct {
	// Dir holds kalos_jobs.csv (read at run time).
	Dir string
	// Workloads: kalos (the 319 jobs, arrivals jittered per seed), spot
	// (SpotJobs jobs drawn per seed from the spot trace's published
	// distribution with Kalos shapes) and mixed (both over the same span,
	// half of the GPU-seconds each).
	Workloads []string
	SpotJobs  int
	// Clusters: superpod and nvl72, of Nodes nodes (about; whole leaves).
	Clusters []string
	Nodes    int
	Loads    []float64
	Modes    []string
	Policies []string
	Seeds    []uint64
	Workers  int
	Options  Options
}

// Cell is one (workload, mode, cluster, load, policy) over the seeds.
type Cell struct {
	Workload, Mode, Cluster, Policy string
	Load                            float64
	Runs                            []Result
}

// Stat is a mean and a standard deviation over seeds.
type Stat struct{ Mean, SD float64 }

func stat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{math.NaN(), math.NaN()}
	}
	m := 0.0
	for _, x := range xs {
		m += x
	}
	m /= float64(len(xs))
	v := 0.0
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	if len(xs) > 1 {
		v /= float64(len(xs) - 1)
	}
	return Stat{m, math.Sqrt(v)}
}

// Measure applies f to each run and summarises.
func (c *Cell) Measure(f func(r *Result) float64) Stat {
	xs := make([]float64, len(c.Runs))
	for i := range c.Runs {
		xs[i] = f(&c.Runs[i])
	}
	return stat(xs)
}

// Measures of a Result, as the report shows them.
var (
	PlacedPct  = func(r *Result) float64 { return pct(r.GangsPlaced, r.Gangs) }
	MinimalPct = func(r *Result) float64 { return pct(r.GangsMinimal, r.GangsPlaced) }
	UtilPct    = func(r *Result) float64 { return 100 * r.Util }
	HeldIdle   = func(r *Result) float64 { return r.HeldIdle }
	HeldPeak   = func(r *Result) float64 { return float64(r.HeldPeak) }
	WaitGangs  = func(r *Result) float64 { return r.WaitGangs }
	WaitAll    = func(r *Result) float64 { return r.WaitAll }
)

func pct(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return 100 * float64(a) / float64(b)
}

// ClusterByName builds a named cluster of about nodes nodes.
func ClusterByName(name string, nodes int) (*Cluster, error) {
	switch name {
	case "superpod":
		return SuperPOD((nodes + 31) / 32 * 32), nil
	case "nvl72":
		return NVL72((nodes + 71) / 72 * 72), nil
	}
	return nil, fmt.Errorf("cluster %q: unknown (want superpod or nvl72)", name)
}

// Run replays the matrix; cells come back in the config's order.
func Run(cfg Config) ([]*Cell, error) {
	kalos, err := LoadKalos(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, p := range cfg.Policies {
		if !slices.Contains(AllPolicies, p) {
			return nil, fmt.Errorf("policy %q: unknown (want one of %v)", p, AllPolicies)
		}
	}
	clusters := map[string]*Cluster{}
	for _, name := range cfg.Clusters {
		c, err := ClusterByName(name, cfg.Nodes)
		if err != nil {
			return nil, err
		}
		clusters[name] = c
	}
	type task struct {
		cell *Cell
		i    int
		c    *Cluster
		jobs []Job
		win  float64
		seed uint64
		opt  Options
	}
	var cells []*Cell
	var tasks []task
	for _, wl := range cfg.Workloads {
		if wl != WorkloadKalos && wl != WorkloadSpot && wl != WorkloadMixed {
			return nil, fmt.Errorf("workload %q: unknown (want kalos, spot or mixed)", wl)
		}
		for _, mode := range cfg.Modes {
			if mode != ModePreferred && mode != ModeRequired {
				return nil, fmt.Errorf("mode %q: unknown (want preferred or required)", mode)
			}
			opt := cfg.Options
			opt.Required = mode == ModeRequired
			for _, cn := range cfg.Clusters {
				c := clusters[cn]
				for _, load := range cfg.Loads {
					for _, p := range cfg.Policies {
						cell := &Cell{Workload: wl, Mode: mode, Cluster: cn, Policy: p, Load: load, Runs: make([]Result, len(cfg.Seeds))}
						cells = append(cells, cell)
						for i, seed := range cfg.Seeds {
							src := Jitter(kalos, seed)
							switch wl {
							case WorkloadSpot:
								src = Spot(kalos, cfg.SpotJobs, seed)
							case WorkloadMixed:
								src = Mixed(src, Spot(kalos, cfg.SpotJobs, seed))
							}
							jobs, win := Scale(src, c.GPUs(), load)
							tasks = append(tasks, task{cell, i, c, jobs, win, seed, opt})
						}
					}
				}
			}
		}
	}
	work := make(chan task)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range max(cfg.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				r, err := Replay(t.c, t.jobs, t.win, t.cell.Policy, t.seed, t.opt)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					continue
				}
				r.Workload, r.Load, r.Seed = t.cell.Workload, t.cell.Load, t.seed
				t.cell.Runs[t.i] = r
			}
		}()
	}
	for _, t := range tasks {
		work <- t
	}
	close(work)
	wg.Wait()
	return cells, firstErr
}
