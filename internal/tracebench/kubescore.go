package tracebench

import (
	"math/rand/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// newGpulinkKube is gpulink's GPU placement with the pods without claims
// left to kube-scheduler (mostAllocated: its bin-packing profile), on GPU
// nodes steered by the controller's taint (steer).
func newGpulinkKube(w *Workload, rng *rand.Rand, hostAware, mostAllocated bool, steer steerMode) (*gpulinkPolicy, error) {
	g, err := newGpulinkPolicy(w, rng, hostAware, nil)
	if err != nil {
		return nil, err
	}
	k := &kubeScheduler{rng: rng, mostAllocated: mostAllocated}
	if steer != steerOff {
		st := &steerTaint{mode: steer, mix: func() *allocate.DemandMix { return g.demand.Mix() }, scarce: g.demandMix}
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
	// scores and tainted are per-call scratch, by feasible node.
	idx     []int
	scores  []int64
	tainted []int
}

// place scores every node the task fits, as kube-scheduler's score
// plugins do: NodeResourcesFit over CPU and memory with equal weights
// (LeastAllocated, the default, or MostAllocated), plus
// NodeResourcesBalancedAllocation, each 0..100 in integers as the plugins
// compute them, plus TaintToleration's normalized score times 3; the
// highest sum wins and ties are broken at random (selectHost). It scores
// every feasible node: kube-scheduler's percentageOfNodesToScore sampling
// is not modelled.
func (k *kubeScheduler) place(c *Cluster, t *Task) (Placement, bool, error) {
	k.idx, k.scores, k.tainted = k.idx[:0], k.scores[:0], k.tainted[:0]
	for i, n := range c.nodes {
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
		n := 0
		if k.taints != nil {
			n = k.taints(c, i)
		}
		k.tainted = append(k.tainted, n)
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
