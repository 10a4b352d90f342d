package tracebench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// policy places one task; ok is false when no node can take it. err is
// for a broken policy only (a placement the cluster would not hold).
type policy interface {
	place(c *Cluster, t *Task) (p Placement, ok bool, err error)
}

// Policy names, in the order reports list them. The headline row is what
// the chart installs by default; the other gpulink rows are named by the
// chart value or deployment they stand for.
const (
	// PolicyGpulink is the chart's defaults: GPU pods ranked with each
	// node's CPU and memory and the recent pods' shapes
	// (controller.rankByStranding: true), pods without GPU claims left to
	// kube-scheduler's default scoring (LeastAllocated) on GPU nodes that
	// carry the controller's PreferNoSchedule taint while they have an
	// idle GPU (controller.steerCPUPods: taint), and a second one while
	// all their GPUs are idle and a scarce shape of the recent pods could
	// run there (controller.steerScarceNodes: true; steer.go).
	PolicyGpulink = "gpulink"
	// PolicyGpulinkNoScarce is the chart with
	// controller.steerScarceNodes: false: the first steering taint only
	// (the chart's defaults before the second).
	PolicyGpulinkNoScarce = "gpulink:steerScarceNodes=false"
	// PolicyGpulinkScoreAll is the chart's defaults with kube-scheduler
	// configured to score every feasible node (percentageOfNodesToScore:
	// 100) for the pods without GPU claims, against its default sampling
	// that every other kube-scheduler row models; not in AllPolicies.
	PolicyGpulinkScoreAll = "gpulink:percentageOfNodesToScore=100"
	// PolicyGpulinkNoSteer is the chart with controller.steerCPUPods: off:
	// pods without GPU claims spread by kube-scheduler over every node
	// (the chart's defaults before the taint).
	PolicyGpulinkNoSteer = "gpulink:steerCPUPods=off"
	// PolicyGpulinkGPUOnly is the chart with controller.rankByStranding:
	// false: nodes ranked on GPUs alone (no Host, no Demand), CPU-only
	// pods left to kube-scheduler with the steering taint.
	PolicyGpulinkGPUOnly = "gpulink:rankByStranding=false"
	// PolicyGpulinkFresh is the chart's defaults on a controller started
	// on an empty cluster: no shape known before the first pods (nothing
	// running to seed the demand mix from): what a user gets who installs
	// the chart on a new cluster. The replay through the real controller
	// (test/scale TestReplayController) is held against it.
	PolicyGpulinkFresh = "gpulink:fresh"
	// PolicyGpulinkCPUPods is the chart's defaults with the pods without
	// GPU claims placed by gpulink too (allocate.ChooseHost): chart value
	// gate.cpuPods.enabled (docs/cpu-pods.md), what the paper's simulator
	// does.
	PolicyGpulinkCPUPods = "gpulink+cpu-pods"
	// PolicyGpulinkMost is the chart's defaults with kube-scheduler
	// configured to bin-pack the pods gpulink does not place
	// (MostAllocated): the profile deployments/scheduler/gpulink-mostalloc.yaml,
	// on the nodes the steering taint marks.
	PolicyGpulinkMost = "gpulink+mostalloc"
	PolicyFGD         = "fgd"
	// PolicyFGDPaper is FGD scored as the paper's artifact scores it:
	// quantized to 0..100 with random ties (fgdPaperScore). With
	// Options.IgnoreMemory the replay is the paper's setup.
	PolicyFGDPaper   = "fgd-paper"
	PolicyBestFit    = "best-fit"
	PolicyDotProduct = "dot-product"
	PolicyPacking    = "gpu-packing"
	PolicyClustering = "gpu-clustering"
	PolicyRandomFit  = "random-fit"
	PolicyFirstFit   = "first-fit"
)

// AllPolicies lists every policy the replay knows, the chart's defaults
// first.
var AllPolicies = []string{PolicyGpulink, PolicyGpulinkFresh, PolicyGpulinkNoScarce, PolicyGpulinkNoSteer, PolicyGpulinkGPUOnly, PolicyGpulinkCPUPods, PolicyGpulinkMost, PolicyGpulinkTaint, PolicyFGD, PolicyFGDPaper, PolicyBestFit, PolicyDotProduct, PolicyPacking, PolicyClustering, PolicyRandomFit, PolicyFirstFit}

// newPolicy builds a policy for one replay; rng breaks ties among equal
// scores at random, as kube-scheduler's selectHost does (the paper runs
// every policy as a kube-scheduler score plugin).
func newPolicy(name string, w *Workload, rng *rand.Rand) (policy, error) {
	switch name {
	case PolicyGpulinkCPUPods:
		return newGpulinkPolicy(w, rng, true, nil)
	case PolicyGpulink:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerScarce})
	case PolicyGpulinkNoScarce:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerWholeFree})
	case PolicyGpulinkScoreAll:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerScarce, scoreAllNodes: true})
	case PolicyGpulinkNoSteer:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerOff})
	case PolicyGpulinkMost:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, mostAllocated: true, steer: steerScarce})
	case PolicyGpulinkFresh:
		return newGpulinkKube(nil, rng, kubeConfig{hostAware: true, steer: steerScarce})
	case PolicyGpulinkGPUOnly:
		// Without the ranking there is no demand mix, and the second
		// taint is kept on no node (controller.steerScarceNodes needs
		// rankByStranding).
		return newGpulinkKube(w, rng, kubeConfig{steer: steerWholeFree})
	case PolicySteerAnyFree:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerAnyFree})
	case PolicySteerUsable:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerUsable})
	case PolicySteerWholeUsable:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerWholeUsable})
	case PolicySteerIdleNode:
		return newGpulinkKube(w, rng, kubeConfig{hostAware: true, steer: steerIdleNode})
	case PolicyGpulinkTaint:
		return newGpulinkPolicy(w, rng, true, offGPUNodes)
	case PolicyFGD:
		return &fgd{w: w, rng: rng}, nil
	case PolicyFGDPaper:
		return &fgd{w: w, rng: rng, quantized: true}, nil
	case PolicyBestFit:
		return scored{rng: rng, score: bestFitScore}, nil
	case PolicyDotProduct:
		return &dotProduct{rng: rng}, nil
	case PolicyPacking:
		return scored{rng: rng, score: packingScore, gpus: packingGPUs}, nil
	case PolicyClustering:
		return scored{rng: rng, score: clusteringScore}, nil
	case PolicyRandomFit:
		return scored{rng: rng, score: func(*Cluster, *nodeState, *Task) float64 { return 0 }}, nil
	case PolicyFirstFit:
		return firstFit{}, nil
	}
	return nil, fmt.Errorf("unknown policy %q (known: %v)", name, AllPolicies)
}

// argmin keeps the lowest score seen, ties broken uniformly at random
// (reservoir sampling, one draw per tie).
type argmin struct {
	rng   *rand.Rand
	idx   int
	score float64
	ties  int
}

func newArgmin(rng *rand.Rand) argmin { return argmin{rng: rng, idx: -1} }

func (a *argmin) offer(i int, s float64) bool {
	switch {
	case a.idx < 0 || s < a.score:
		a.idx, a.score, a.ties = i, s, 1
		return true
	case s == a.score:
		a.ties++
		if a.rng.IntN(a.ties) == 0 {
			a.idx = i
			return true
		}
	}
	return false
}

// scored is a policy that ranks each feasible node by a score (lower is
// better) and then takes GPUs by gpus (defaultGPUs when nil).
type scored struct {
	rng   *rand.Rand
	score func(c *Cluster, n *nodeState, t *Task) float64
	gpus  func(n *nodeState, t *Task) []int
}

func (s scored) place(c *Cluster, t *Task) (Placement, bool, error) {
	best := newArgmin(s.rng)
	for i, n := range c.nodes {
		if n.fits(t) {
			best.offer(i, s.score(c, n, t))
		}
	}
	if best.idx < 0 {
		return Placement{}, false, nil
	}
	n := c.nodes[best.idx]
	pick := defaultGPUs
	if s.gpus != nil {
		pick = s.gpus
	}
	return Placement{Node: best.idx, GPUs: pick(n, t)}, true, nil
}

// bestFitScore: the node with the least resources left after placing the
// task, a sum over CPU, memory and GPU each scaled by the largest node's
// capacity with equal weights (the paper: "the least remaining resources,
// computed as a weighted sum of all resource dimensions").
func bestFitScore(c *Cluster, n *nodeState, t *Task) float64 {
	return float64(n.cpuLeft-t.CPUMilli)/float64(c.maxCPU) +
		float64(n.memLeft-t.MemoryMiB)/float64(c.maxMem) +
		float64(n.leftTotal()-t.TotalMilli())/float64(max(1, c.maxGPUs)*MilliPerGPU)
}

// packingScore, GPU packing (the paper's baseline after Gandiva-style
// packing): first a share on a GPU that already holds work (the fuller
// the better), then a node that is already in use (the fewer fresh GPUs
// the task takes the better), then an idle node (the fewer GPUs it has
// the better). CPU-only tasks score equal everywhere.
func packingScore(_ *Cluster, n *nodeState, t *Task) float64 {
	if t.GPUs == 0 {
		return 0
	}
	gpus := packingGPUs(n, t)
	fresh := 0
	var leftOnUsed int64
	for _, g := range gpus {
		if n.left[g] == MilliPerGPU {
			fresh++
		} else {
			leftOnUsed += int64(n.left[g])
		}
	}
	const tier = 1e6
	switch {
	case fresh == 0:
		return float64(leftOnUsed)
	case n.freeGPUs() < len(n.left):
		return tier + float64(fresh)
	default:
		return 2*tier + float64(len(n.left))
	}
}

// packingGPUs takes the GPUs with the least left that fit, fullest first.
func packingGPUs(n *nodeState, t *Task) []int {
	if t.GPUs == 0 {
		return nil
	}
	order := make([]int, len(n.left))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(n.left[a] - n.left[b]) })
	out := make([]int, 0, t.GPUs)
	for _, g := range order {
		if int(n.left[g]) >= t.GPUMilli && len(out) < t.GPUs {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// clusteringScore, GPU clustering (the paper's baseline): keep tasks of
// one GPU demand together. First nodes whose GPU tasks all have the
// task's demand (GPUs, milli), then nodes that hold it among others, then
// nodes without GPU tasks, then the rest; within a tier the node with
// less GPU left. CPU-only tasks score equal everywhere.
func clusteringScore(_ *Cluster, n *nodeState, t *Task) float64 {
	if t.GPUs == 0 {
		return 0
	}
	const tier = 1e6
	var s float64
	_, has := n.classes[[2]int{t.GPUs, t.GPUMilli}]
	switch {
	case has && len(n.classes) == 1:
		s = 0
	case has:
		s = tier
	case len(n.classes) == 0:
		s = 2 * tier
	default:
		s = 3 * tier
	}
	return s + float64(n.leftTotal())
}

// dotProduct, Tetris's alignment heuristic as the paper's baseline: the
// placement whose demand vector has the smallest dot product with what
// the node has left, both scaled by the node's capacity, over CPU,
// memory and GPU. For a share the GPU dimension is the GPU it would take
// (each fitting GPU is a candidate), for whole GPUs the node's free
// GPUs.
type dotProduct struct{ rng *rand.Rand }

func (d *dotProduct) place(c *Cluster, t *Task) (Placement, bool, error) {
	best := newArgmin(d.rng)
	var bestGPU int
	for i, n := range c.nodes {
		if !n.fits(t) {
			continue
		}
		cpuCap, memCap := float64(max(1, n.spec.CPUMilli)), float64(max(1, n.spec.MemoryMiB))
		base := float64(t.CPUMilli)/cpuCap*float64(n.cpuLeft)/cpuCap + float64(t.MemoryMiB)/memCap*float64(n.memLeft)/memCap
		switch {
		case t.GPUs == 0:
			best.offer(i, base)
		case t.Share():
			for g, l := range n.left {
				if int(l) >= t.GPUMilli && best.offer(i, base+float64(t.GPUMilli)/MilliPerGPU*float64(l)/MilliPerGPU) {
					bestGPU = g
				}
			}
		default:
			capG := float64(len(n.left) * MilliPerGPU)
			best.offer(i, base+float64(t.TotalMilli())/capG*float64(n.leftTotal())/capG)
		}
	}
	return placeOnBest(c, t, best.idx, bestGPU)
}

// firstFit: the first node in list order that fits, the first GPUs that
// fit on it (NVIDIA's DRA driver and kube-scheduler's structured
// allocator take the first devices that satisfy a request).
type firstFit struct{}

func (firstFit) place(c *Cluster, t *Task) (Placement, bool, error) {
	for i, n := range c.nodes {
		if !n.fits(t) {
			continue
		}
		if t.Share() {
			for g, l := range n.left {
				if int(l) >= t.GPUMilli {
					return Placement{Node: i, GPUs: []int{g}}, true, nil
				}
			}
		}
		return Placement{Node: i, GPUs: lowestFree(n, t.GPUs)}, true, nil
	}
	return Placement{}, false, nil
}

// fgd is Fragmentation Gradient Descent: the placement (node and, for a
// share, GPU) that increases the node's fragmentation F_n(M) the least.
type fgd struct {
	w    *Workload
	rng  *rand.Rand
	left []int32 // scratch
	// quantized scores as the paper's artifact's FGD plugin does
	// (fgdPaperScore): 0..100 integers, random ties among nodes, a share
	// on the first GPU of its node's best score.
	quantized bool
}

// fgdPaperScore is the artifact's FGD score of a placement that moves the
// node's fragment from before to after (milli GPU): sigmoid((before -
// after) / 1000) times kube-scheduler's MaxNodeScore (100), truncated to
// an integer, higher better (hkust-adsl/kubernetes-scheduler-simulator,
// pkg/simulator/plugin/fgd_score.go). Many placements share a score, and
// kube-scheduler's selectHost picks among the nodes of the best at random.
func fgdPaperScore(before, after float64) int64 {
	return int64(100 / (1 + math.Exp(-(before-after)/1000)))
}

func (f *fgd) place(c *Cluster, t *Task) (Placement, bool, error) {
	best := newArgmin(f.rng)
	var bestGPU int
	// cost is what the argmin ranks: the fragment's growth, or minus the
	// quantized score.
	total := float64(max(1, f.w.total))
	cost := func(before, after int64) float64 {
		if f.quantized {
			return -float64(fgdPaperScore(float64(before)/total, float64(after)/total))
		}
		return float64(after - before)
	}
	for i, n := range c.nodes {
		if !n.fits(t) {
			continue
		}
		before := f.w.nodeFrag(n)
		cpu, mem := n.cpuLeft-t.CPUMilli, n.memLeft-t.MemoryMiB
		if n.kind == nil {
			best.offer(i, 0)
			continue
		}
		access := f.w.accessFor(n.spec.Model)
		f.left = append(f.left[:0], n.left...)
		switch {
		case t.GPUs == 0:
			best.offer(i, cost(before, f.w.fragScaled(access, cpu, mem, f.left)))
		case t.Share() && f.quantized:
			// The artifact scores each GPU that fits and keeps the first
			// of the best score; the node is offered with that score.
			nodeBest, nodeGPU := math.Inf(1), -1
			for g, l := range n.left {
				if int(l) < t.GPUMilli {
					continue
				}
				f.left[g] = l - int32(t.GPUMilli)
				if v := cost(before, f.w.fragScaled(access, cpu, mem, f.left)); v < nodeBest {
					nodeBest, nodeGPU = v, g
				}
				f.left[g] = l
			}
			if best.offer(i, nodeBest) {
				bestGPU = nodeGPU
			}
		case t.Share():
			// GPUs with equal left give equal fragments: try each value once.
			for g, l := range n.left {
				if int(l) < t.GPUMilli || slices.Contains(n.left[:g], l) {
					continue
				}
				f.left[g] = l - int32(t.GPUMilli)
				if best.offer(i, cost(before, f.w.fragScaled(access, cpu, mem, f.left))) {
					bestGPU = g
				}
				f.left[g] = l
			}
		default:
			for _, g := range lowestFree(n, t.GPUs) {
				f.left[g] = 0
			}
			best.offer(i, cost(before, f.w.fragScaled(access, cpu, mem, f.left)))
		}
	}
	return placeOnBest(c, t, best.idx, bestGPU)
}

// placeOnBest is the placement on the node a scoring policy chose (-1:
// none fits): nothing for a CPU-only task, the GPU it scored for a share,
// the lowest free GPUs for whole ones.
func placeOnBest(c *Cluster, t *Task, node, shareGPU int) (Placement, bool, error) {
	switch {
	case node < 0:
		return Placement{}, false, nil
	case t.GPUs == 0:
		return Placement{Node: node}, true, nil
	case t.Share():
		return Placement{Node: node, GPUs: []int{shareGPU}}, true, nil
	}
	return Placement{Node: node, GPUs: lowestFree(c.nodes[node], t.GPUs)}, true, nil
}
