package tracebench

import (
	"math/rand/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// kubeConfig is how a replay row deploys gpulink and kube-scheduler for
// the pods gpulink does not place.
type kubeConfig struct {
	// hostAware: controller.rankByStranding (GPU pods ranked with each
	// node's CPU and memory and the recent pods' shapes).
	hostAware bool
	// mostAllocated: kube-scheduler's bin-packing profile
	// (deployments/scheduler/gpulink-mostalloc.yaml) instead of its
	// default LeastAllocated.
	mostAllocated bool
	// steer: which GPU nodes carry the controller's steering taint.
	steer steerMode
	// scoreAllNodes: kube-scheduler configured with
	// percentageOfNodesToScore: 100; by default it samples (below).
	scoreAllNodes bool
}

// newGpulinkKube is gpulink's GPU placement with the pods without claims
// left to kube-scheduler.
func newGpulinkKube(w *Workload, rng *rand.Rand, cfg kubeConfig) (*gpulinkPolicy, error) {
	g, err := newGpulinkPolicy(w, rng, cfg.hostAware, nil)
	if err != nil {
		return nil, err
	}
	k := &kubeScheduler{rng: rng, mostAllocated: cfg.mostAllocated, sample: !cfg.scoreAllNodes}
	if cfg.steer != steerOff {
		st := &steerTaint{mode: cfg.steer, mix: func() *allocate.DemandMix { return g.demand.Mix() }, scarce: g.demandMix}
		k.taints = st.taints
	}
	g.cpuOnly = k.place
	return g, nil
}

// Weights of kube-scheduler's default profile (pkg/scheduler/apis/config
// /v1 getDefaultPlugins) for the score plugins that rank a pod without
// GPU claims among nodes that fit it: NodeResourcesFit and
// NodeResourcesBalancedAllocation 1 each, TaintToleration 3. Each plugin
// scores 0..100 (framework.MaxNodeScore).
const (
	kubeMaxNodeScore        = 100
	kubeFitWeight           = 1
	kubeBalancedWeight      = 1
	kubeTaintTolerateWeight = 3
)

// kubeScheduler is kube-scheduler's placement of pods without claims,
// with its default profile or the bin-packing one (mostAllocated), on a
// cluster whose GPU nodes may carry gpulink's PreferNoSchedule steering
// taints (taints non-nil: how many of gpulink's PreferNoSchedule taints
// node i carries now).
type kubeScheduler struct {
	rng           *rand.Rand
	mostAllocated bool
	taints        func(c *Cluster, i int) int
	// sample: kube-scheduler's default percentageOfNodesToScore, which
	// stops filtering once it has found kubeFeasibleNodesToFind nodes,
	// starting where the pod before it stopped (next).
	sample bool
	next   int
	// scores and tainted are per-call scratch, by feasible node.
	idx     []int
	scores  []int64
	tainted []int
}

// place scores the nodes the task fits, as kube-scheduler's score
// plugins do: NodeResourcesFit over CPU and memory with equal weights
// (LeastAllocated, the default, or MostAllocated), plus
// NodeResourcesBalancedAllocation, each 0..100 in integers as the plugins
// compute them, plus TaintToleration's normalized score times 3; the
// highest sum wins and ties are broken at random (selectHost). With
// sample, it filters as kube-scheduler's findNodesThatPassFilters does:
// the nodes in their order from where the previous pod's search stopped
// (nextStartNodeIndex), until kubeFeasibleNodesToFind of them fit; only
// those are scored. The pods gpulink places do not move that index: each
// fits only its allocated node, so kube-scheduler visits every node for
// them and comes back to where it was.
func (k *kubeScheduler) place(c *Cluster, t *Task) (Placement, bool, error) {
	k.idx, k.scores, k.tainted = k.idx[:0], k.scores[:0], k.tainted[:0]
	total := len(c.nodes)
	want := total
	if k.sample {
		want = kubeFeasibleNodesToFind(total)
	}
	processed := 0
	for j := 0; j < total && len(k.idx) < want; j++ {
		i := (k.next + j) % total
		n := c.nodes[i]
		processed++
		if !n.fits(t) {
			continue
		}
		cpuCap, memCap := max(1, n.spec.CPUMilli), max(1, n.spec.MemoryMiB)
		cpuFree, memFree := n.cpuLeft-t.CPUMilli, n.memLeft-t.MemoryMiB
		fit := (cpuFree*100/cpuCap + memFree*100/memCap) / 2
		if k.mostAllocated {
			fit = ((cpuCap-cpuFree)*100/cpuCap + (memCap-memFree)*100/memCap) / 2
		}
		cpuFrac := float64(cpuCap-cpuFree) / float64(cpuCap)
		memFrac := float64(memCap-memFree) / float64(memCap)
		d := cpuFrac - memFrac
		if d < 0 {
			d = -d
		}
		balanced := int64((1 - d/2) * 100)
		k.idx = append(k.idx, i)
		k.scores = append(k.scores, kubeFitWeight*fit+kubeBalancedWeight*balanced)
		taints := 0
		if k.taints != nil {
			taints = k.taints(c, i)
		}
		k.tainted = append(k.tainted, taints)
	}
	if total > 0 {
		k.next = (k.next + processed) % total
	}
	if len(k.idx) == 0 {
		return Placement{}, false, nil
	}
	taintScores := taintTolerationScores(k.tainted)
	best := newArgmin(k.rng)
	for j, i := range k.idx {
		best.offer(i, -float64(k.scores[j]+kubeTaintTolerateWeight*taintScores[j]))
	}
	return Placement{Node: best.idx}, true, nil
}

// taintTolerationScores is TaintToleration's normalized score of each
// feasible node for a pod tolerating none of gpulink's taint, as
// kube-scheduler computes it: Score counts the node's PreferNoSchedule
// taints the pod does not tolerate (tainted: 0, 1 or 2 here), NormalizeScore is
// helper.DefaultNormalizeScore(MaxNodeScore, reverse=true, scores): with
// maxCount the largest count among the nodes scored, a node scores
// MaxNodeScore - MaxNodeScore*count/maxCount, and every node
// MaxNodeScore when maxCount is 0. So a node without the taint outscores
// one with it by 100 × weight 3 = 300 points whenever both are feasible,
// more than NodeResourcesFit and BalancedAllocation together can differ
// (200): the taint decides, and the spreading only ranks nodes alike.
func taintTolerationScores(tainted []int) []int64 {
	out := make([]int64, len(tainted))
	var maxCount int64
	for j, t := range tainted {
		out[j] = int64(t)
		maxCount = max(maxCount, out[j])
	}
	for j := range out {
		if maxCount == 0 {
			out[j] = kubeMaxNodeScore
			continue
		}
		out[j] = kubeMaxNodeScore - kubeMaxNodeScore*out[j]/maxCount
	}
	return out
}

// kube-scheduler's bounds of its adaptive sampling (pkg/scheduler
// schedule_one.go: minFeasibleNodesToFind, minFeasibleNodesPercentageToFind,
// and the base of 50 % less 1 % per 125 nodes).
const (
	kubeMinFeasibleNodesToFind   = 100
	kubeMinFeasibleNodesPercent  = 5
	kubeBaseFeasibleNodesPercent = 50
	kubeNodesPerPercentDecrease  = 125
)

// kubeFeasibleNodesToFind is kube-scheduler's numFeasibleNodesToFind with
// percentageOfNodesToScore unset (the default, which the chart keeps):
// all nodes below 100, else (50 - nodes/125) % of them, at least 5 % and
// at least 100. On openb's 1,213 GPU nodes: 41 %, 497 nodes.
func kubeFeasibleNodesToFind(nodes int) int {
	if nodes < kubeMinFeasibleNodesToFind {
		return nodes
	}
	percent := max(kubeBaseFeasibleNodesPercent-nodes/kubeNodesPerPercentDecrease, kubeMinFeasibleNodesPercent)
	return max(nodes*percent/100, kubeMinFeasibleNodesToFind)
}
