package gangbench

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/gpulink/gpulink/driver/gang"
)

// Policy names.
const (
	PolicyGPULink = "gpulink"
	// PolicyGPULinkReserving is gpulink with the controller's starvation
	// reservation (controller.gangs.starvationBound, Options.StarvationBound;
	// reserve.go): the row of the chart's default, beside the plain
	// backfill queue every other row shares.
	PolicyGPULinkReserving = "gpulink:starvationBound"
	PolicyKueue            = "kueue-tas"
	PolicyVolcano          = "volcano"
	PolicyRandom           = "random"
	PolicyPerPod           = "per-pod-greedy"
)

// AllPolicies are the policies a replay runs by default, gpulink first.
var AllPolicies = []string{PolicyGPULink, PolicyGPULinkReserving, PolicyKueue, PolicyVolcano, PolicyRandom, PolicyPerPod}

// isGPULink tells whether policy is one of gpulink's rows.
func isGPULink(policy string) bool {
	return policy == PolicyGPULink || policy == PolicyGPULinkReserving
}

// placer places a whole job or nothing, within one domain of maxLevel
// (the cluster's top level: anywhere): one node per pod, not yet taken
// from the state; nil when it does not fit.
type placer func(s *state, j *Job, maxLevel int, r *rand.Rand) []int

func placerOf(policy string) placer {
	switch policy {
	case PolicyGPULink, PolicyGPULinkReserving:
		return placeGPULink
	case PolicyKueue:
		return placeKueue
	case PolicyVolcano:
		return placeVolcano
	case PolicyRandom:
		return placeRandom
	}
	return nil
}

// placeGPULink is what gpulink's controller does. A gang goes to
// driver/gang's Place, with each node's slots the pods of the job's size
// its free GPUs hold (the simulated nodes' GPUs are interchangeable;
// inside a node the allocator's link choice is not replayed here) and the
// demand the controller's (driver/gang's DemandHistory of the last
// Options.History gangs). A single pod is no gang: the controller places
// it with the planner, not driver/gang (placeSingle).
func placeGPULink(s *state, j *Job, maxLevel int, _ *rand.Rand) []int {
	if j.Pods == 1 {
		return placeSingle(s, j)
	}
	for i := range s.nodes {
		s.nodes[i].Slots = s.free[i] / j.GPUsPerPod
		s.nodes[i].FreeGPUs = s.free[i]
	}
	req := gang.Request{Name: strconv.Itoa(j.ID), Pods: j.Pods, GPUsPerPod: j.GPUsPerPod, Demand: s.demand}
	if maxLevel < s.c.H.Cluster() {
		req.Level, req.Constraint = maxLevel, gang.Required
	}
	p, err := gang.Place(s.c.H, req, s.nodes)
	if err != nil {
		return nil
	}
	out := make([]int, len(p.Nodes))
	for k, n := range p.Nodes {
		out[k] = s.index[n]
	}
	return out
}

// tdomain is a topology domain as the baselines see it: its nodes and the
// pods of the job it holds.
type tdomain struct {
	name  string
	nodes []int
	count int
	free  int
}

// domainsAt groups nodes by their domain at level lv (0: each node
// alone), counting the pods of g GPUs each holds.
func (s *state) domainsAt(nodes []int, lv, g int) []tdomain {
	var out []tdomain
	if lv == 0 {
		for _, i := range nodes {
			out = append(out, tdomain{name: s.c.Nodes[i].Name, nodes: []int{i}, count: s.free[i] / g, free: s.free[i]})
		}
		return out
	}
	pos := map[int]int{}
	for _, i := range nodes {
		d := s.c.domainOf[lv][i]
		if d < 0 {
			d = -2 - i // alone without the label
		}
		p, ok := pos[d]
		if !ok {
			p = len(out)
			pos[d] = p
			name := s.c.Nodes[i].Name
			if d >= 0 && s.c.Nodes[i].Domains[lv-1] != "" {
				name = s.c.Nodes[i].Domains[lv-1]
			}
			out = append(out, tdomain{name: name})
		}
		out[p].nodes = append(out[p].nodes, i)
		out[p].count += s.free[i] / g
		out[p].free += s.free[i]
	}
	return out
}

func (s *state) allNodes() []int {
	all := make([]int, len(s.free))
	for i := range all {
		all[i] = i
	}
	return all
}

// placeKueue is Kueue TAS's default (BestFit) assignment, written from
// KEP-2724 and its code's description: for a PodSet with a preferred
// topology at the lowest level (kubernetes.io/hostname), starting there
// and going up while no single domain holds the pods (with a required
// level, that level only), the fitting
// domain with the fewest pods of room (domains sorted by room, largest
// first, ties by name, and the first of the smallest that fit); where none
// fits at the top level, the largest domains greedily. Then level by level
// down, the chosen domains' children sorted largest first are taken
// greedily, the last one best fit (the smallest that holds the rest).
func placeKueue(s *state, j *Job, maxLevel int, _ *rand.Rand) []int {
	g, k := j.GPUsPerPod, j.Pods
	levels := append([]int{0}, s.c.Levels...)
	required := maxLevel < s.c.H.Cluster()
	all := s.allNodes()
	var chosen []tdomain
	at := -1
	for x, lv := range levels {
		if required && lv != maxLevel {
			continue
		}
		if lv == 0 && (x < len(levels)-1 || required) {
			// Nodes sorted by room, the first of the smallest that fits:
			// the node with the least room for k, ties by name.
			best := -1
			for i := range s.free {
				if c := s.free[i] / g; c >= k && (best < 0 || c < s.free[best]/g || c == s.free[best]/g && s.c.Nodes[i].Name < s.c.Nodes[best].Name) {
					best = i
				}
			}
			if best >= 0 {
				chosen, at = []tdomain{{nodes: []int{best}, count: k}}, 0
			}
			if best >= 0 || required {
				break
			}
			continue
		}
		ds := sortKueue(s.domainsAt(all, lv, g))
		if d, ok := bestFitKueue(ds, k); ok {
			chosen, at = []tdomain{d}, x
			chosen[0].count = k
			break
		}
		if required {
			break
		}
		if x == len(levels)-1 {
			chosen, at = minimumKueue(ds, k), x
		}
	}
	if chosen == nil {
		return nil
	}
	for ; at > 0; at-- {
		var nodes []int
		for _, d := range chosen {
			nodes = append(nodes, d.nodes...)
		}
		chosen = minimumKueue(sortKueue(s.domainsAt(nodes, levels[at-1], g)), k)
		if chosen == nil {
			return nil
		}
	}
	var out []int
	for _, d := range chosen {
		for range d.count {
			out = append(out, d.nodes[0])
		}
	}
	return out
}

func sortKueue(ds []tdomain) []tdomain {
	slices.SortFunc(ds, func(a, b tdomain) int { return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.name, b.name)) })
	return ds
}

// bestFitKueue is findBestFitDomainIdx over domains sorted largest first:
// the first domain of the smallest room that still holds k.
func bestFitKueue(ds []tdomain, k int) (tdomain, bool) {
	if len(ds) == 0 || ds[0].count < k {
		return tdomain{}, false
	}
	best := 0
	for i, d := range ds {
		if d.count >= k && d.count != ds[best].count {
			best = i
		}
	}
	return ds[best], true
}

// minimumKueue is updateCountsToMinimum: domains sorted largest first
// taken greedily, the last one best fit; nil when they hold fewer than k.
func minimumKueue(ds []tdomain, k int) []tdomain {
	var out []tdomain
	for i := 0; i < len(ds) && k > 0; i++ {
		d := ds[i]
		if d.count >= k {
			d, _ = bestFitKueue(ds[i:], k)
			d.count = k
			return append(out, d)
		}
		if d.count == 0 {
			break
		}
		out = append(out, d)
		k -= d.count
	}
	if k > 0 {
		return nil
	}
	return out
}

// placeVolcano is Volcano's network-topology-aware scheduling with its
// default node order, written from its documentation: a job of several
// pods (soft mode) goes to the lowest HyperNode tier with a HyperNode
// that holds all of it; among those, the one the node-order plugins score
// highest, with the default least-requested weight the emptiest (most
// free GPUs, ties at random); its pods go one by one to the node with the
// most free GPUs there (ties at random). Where no HyperNode holds the job,
// and for single pods, the nodes of the whole cluster. With a required
// level (hard mode), tiers up to it only (its lowest tier is a HyperNode:
// a gang that fits one node still gets the lowest tier). Volcano's newer
// HyperNode bin-packing option is not modelled.
func placeVolcano(s *state, j *Job, maxLevel int, r *rand.Rand) []int {
	g, k := j.GPUsPerPod, j.Pods
	nodes := s.allNodes()
	if k > 1 {
		found := false
		limit := maxLevel
		if len(s.c.Levels) > 0 {
			limit = max(limit, s.c.Levels[0])
		}
		for _, lv := range s.c.Levels {
			if lv > limit {
				break
			}
			var win *tdomain
			ties := 0
			for _, d := range s.domainsAt(nodes, lv, g) {
				if d.count < k {
					continue
				}
				switch {
				case win == nil || d.free > win.free:
					dd := d
					win, ties = &dd, 1
				case d.free == win.free:
					ties++
					if r.IntN(ties) == 0 {
						dd := d
						win = &dd
					}
				}
			}
			if win != nil {
				nodes, found = win.nodes, true
				break
			}
		}
		if !found && maxLevel < s.c.H.Cluster() {
			return nil
		}
	}
	return spreadPods(s, nodes, g, k, r)
}

// spreadPods puts k pods one by one on the node of nodes with the most
// free GPUs left (ties at random); nil if they do not fit.
func spreadPods(s *state, nodes []int, g, k int, r *rand.Rand) []int {
	taken := make(map[int]int, k)
	out := make([]int, 0, k)
	for range k {
		best := s.leastAllocatedTaking(nodes, g, taken, r)
		if best < 0 {
			return nil
		}
		taken[best] += g
		out = append(out, best)
	}
	return out
}

// placeRandom places the job, all or nothing, each pod on a node drawn
// uniformly among those with room left; with a required level, in a
// domain of that level drawn uniformly among those that hold the job.
func placeRandom(s *state, j *Job, maxLevel int, r *rand.Rand) []int {
	g := j.GPUsPerPod
	var cand []int
	room := map[int]int{}
	if maxLevel < s.c.H.Cluster() {
		var fit []tdomain
		for _, d := range s.domainsAt(s.allNodes(), maxLevel, g) {
			if d.count >= j.Pods {
				fit = append(fit, d)
			}
		}
		if len(fit) == 0 {
			return nil
		}
		for _, i := range fit[r.IntN(len(fit))].nodes {
			if s.free[i] >= g {
				cand = append(cand, i)
				room[i] = s.free[i] / g
			}
		}
	} else {
		for f := g; f <= GPUsPerNode; f++ {
			for _, i := range s.byFree[f] {
				cand = append(cand, i)
				room[i] = f / g
			}
		}
	}
	slices.Sort(cand) // the buckets' order depends on history; the draw must not
	out := make([]int, 0, j.Pods)
	for range j.Pods {
		if len(cand) == 0 {
			return nil
		}
		x := r.IntN(len(cand))
		i := cand[x]
		out = append(out, i)
		if room[i]--; room[i] == 0 {
			cand[x] = cand[len(cand)-1]
			cand = cand[:len(cand)-1]
		}
	}
	return out
}

// placeSingle is how gpulink's controller places a pod outside any gang:
// not through driver/gang but the planner's node choice
// (allocate.ChooseNode): the best links (all alike here: the simulated
// GPUs are interchangeable), the least stranded by the demand mix and then
// binpack (here both: the fewest free GPUs left on the node), then the
// node's tie key (its domains, widest first, then its name), so equal
// nodes fill one domain before the next.
func placeSingle(s *state, j *Job) []int {
	best := -1
	for i, f := range s.free {
		if f >= j.GPUsPerPod && (best < 0 || f < s.free[best] || f == s.free[best] && s.c.tieRank[i] < s.c.tieRank[best]) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return []int{best}
}
