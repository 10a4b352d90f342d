package allocate

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// onlineMaxGPUs bounds the nodes the online optimum is computed on: its
// states are the ways the running jobs can lie on the node.
const onlineMaxGPUs = 10

// jobsState is the jobs running on a node, each as its set of positions,
// in decreasing order, zero-padded. The order of the jobs does not matter:
// the next to end is drawn uniformly among them.
type jobsState [onlineMaxGPUs]uint16

func (s jobsState) busy() uint64 {
	var m uint64
	for _, j := range s {
		m |= uint64(j)
	}
	return m
}

func (s jobsState) count() int {
	for i, j := range s {
		if j == 0 {
			return i
		}
	}
	return len(s)
}

func (s jobsState) with(set uint64) jobsState {
	m := s.count()
	s[m] = uint16(set)
	slices.SortFunc(s[:m+1], func(a, b uint16) int { return int(b) - int(a) })
	return s
}

func (s jobsState) without(i int) jobsState {
	m := s.count()
	copy(s[i:m], s[i+1:m])
	s[m-1] = 0
	return s
}

// onlineMDP is a churn family on one node as a Markov decision process:
// each step ends a uniformly drawn running job with probability freeP
// (always when at most one GPU is free and the family drains), else a
// request of a size drawn from the mix arrives, fails when too few GPUs
// are free, and otherwise takes a set of the free GPUs that the policy
// chooses. value[t][s] is the expected number of multi-GPU requests the
// best online policy puts on their ideal class in the t steps left from
// jobs s: the most any allocator that knows the family's distribution but
// not the sequence can get.
type onlineMDP struct {
	topo    *topology.Topology
	n       int
	w       workload
	sizeP   []float64 // probability of each size, sizes above n left out
	onIdeal []bool    // per set of two or more GPUs: on its size's ideal class
	value   []map[jobsState]float64
}

// sizeProbs is the probability of each request size of w on n GPUs, as
// drawSize draws them (sizes above n left out).
func sizeProbs(w workload, n int) []float64 {
	out := make([]float64, n+1)
	var total float64
	for k, p := range w.mix {
		if k <= n {
			total += p
		}
	}
	for k, p := range w.mix {
		if k <= n {
			out[k] = p / total
		}
	}
	return out
}

func newOnlineMDP(topo *topology.Topology, w workload, steps int) *onlineMDP {
	n := topo.Len()
	m := &onlineMDP{topo: topo, n: n, w: w, sizeP: sizeProbs(w, n), value: make([]map[jobsState]float64, steps+1)}
	ideal := idealClasses(topo)
	all := fullMask(n)
	m.onIdeal = make([]bool, all+1)
	for s := all; s != 0; s = (s - 1) & all {
		if k := bits.OnesCount64(s); k >= 2 {
			m.onIdeal[s] = setKey(topo, s).link() >= ideal[k]
		}
	}
	for t := range m.value {
		m.value[t] = map[jobsState]float64{}
	}
	return m
}

// val is the expected ideal placements in t steps from s.
func (m *onlineMDP) val(t int, s jobsState) float64 {
	if t == 0 {
		return 0
	}
	if v, ok := m.value[t][s]; ok {
		return v
	}
	jobs := s.count()
	freeN := m.n - bits.OnesCount64(s.busy())
	v := churnStep(m.w, m.sizeP, jobs, freeN, func() float64 {
		var ends float64
		for i := range jobs {
			ends += m.val(t-1, s.without(i))
		}
		return ends
	}, func(k int) float64 {
		if k > freeN {
			return m.val(t-1, s)
		}
		_, q := m.choose(t, s, k)
		return q
	})
	m.value[t][s] = v
	return v
}

// churnStep is one step of a churn family's process (churnOps) from a
// state with jobs running and free GPUs free, as the models here take it:
// with the family's end probability (1 when at most one GPU is free and
// the family drains) the value after a uniformly drawn job ends, given
// ends as the sum over the jobs, else the value after a request of each
// size, weighted by its probability.
func churnStep(w workload, sizeP []float64, jobs, free int, ends func() float64, request func(k int) float64) float64 {
	endP := 0.0
	if jobs > 0 {
		endP = w.freeP
		if w.drain && free <= 1 {
			endP = 1
		}
	}
	var v float64
	if endP > 0 {
		v += endP * ends() / float64(jobs)
	}
	if endP < 1 {
		for k, p := range sizeP {
			if p > 0 {
				v += (1 - endP) * p * request(k)
			}
		}
	}
	return v
}

// choose is the set the policy takes for a request of k GPUs with t steps
// left (this one included) and the expected ideal placements from here
// with it; the lowest mask of the best value.
func (m *onlineMDP) choose(t int, s jobsState, k int) (uint64, float64) {
	busy := s.busy()
	q := func(set uint64) float64 {
		v := m.val(t-1, s.with(set))
		if m.onIdeal[set] {
			v++
		}
		return v
	}
	free := fullMask(m.n) &^ busy
	best, bestV := uint64(0), -1.0
	for set := free; set != 0; set = (set - 1) & free {
		if bits.OnesCount64(set) != k {
			continue
		}
		// Ties within rounding are ties: the lowest set wins them, so the
		// choice does not depend on the order of float additions.
		if v := q(set); v > bestV+1e-9 || v > bestV-1e-9 && set < best {
			best, bestV = set, max(v, bestV)
		}
	}
	return best, bestV
}

// onlineOptimum is the best online policy of a family on one node,
// solved exactly: the general MDP on nodes of at most onlineMaxGPUs GPUs,
// the grouped one where the ideal classes are "in one group".
type onlineOptimum struct {
	steps   int
	general *onlineMDP
	grouped *groupedMDP
}

// newOnlineOptimum returns nil where neither model applies (a node of more
// than onlineMaxGPUs GPUs whose ideal classes are not groups of at most
// groupedMaxGroups), and for families with pinned requests, whose
// failures (a pinned request below its class holds nothing) the models
// do not have.
func newOnlineOptimum(topo *topology.Topology, w workload) *onlineOptimum {
	if w.strictP > 0 {
		return nil
	}
	if g, ok := groupsOf(topo, w.mix); ok && len(g.members) <= groupedMaxGroups && topo.Len() <= groupedMaxJobs {
		return &onlineOptimum{steps: w.steps, grouped: newGroupedMDP(g, topo.Len(), w, w.steps)}
	}
	if topo.Len() <= onlineMaxGPUs {
		return &onlineOptimum{steps: w.steps, general: newOnlineMDP(topo, w, w.steps)}
	}
	return nil
}

// expected is the expected number of multi-GPU requests of a sequence the
// optimum puts on their ideal class.
func (o *onlineOptimum) expected() float64 {
	if o.grouped != nil {
		return o.grouped.val(o.steps, groupedState{})
	}
	return o.general.val(o.steps, jobsState{})
}

// pick is the optimum's set for a request of k GPUs at step (0-based) with
// the jobs live running on node.
func (o *onlineOptimum) pick(node *NodeState, live map[int]Result, step, k int) []int {
	if o.grouped != nil {
		row, _ := o.grouped.choose(o.steps-step, o.grouped.state(live), k)
		return o.grouped.gpus(node, row)
	}
	var jobs jobsState
	for _, r := range live {
		jobs = jobs.with(maskOf(r.GPUs))
	}
	set, _ := o.general.choose(o.steps-step, jobs, k)
	return positions(set)
}

// onlineShares plays seeds 1..churnSeeds of a family with the online
// optimum's choices (nil where newOnlineOptimum is), from the optimum
// solvedBound keeps. Its memo is not for concurrent use: the benchmark
// plays it alone.
func onlineShares(tb testing.TB, topo *topology.Topology, w workload) []float64 {
	tb.Helper()
	o := solvedBound(topo, w).optimum
	if o == nil {
		return nil
	}
	out := make([]float64, churnSeeds)
	for seed := range out {
		// The steps whose request is placed, in order: those are the
		// calls of the pick below.
		var placed []int
		for i, op := range churnOps(w, topo.Len(), uint64(seed+1), w.steps) {
			if op.size > 0 && !op.full {
				placed = append(placed, i)
			}
		}
		call := 0
		out[seed] = playChurnLive(tb, topo, func(n *NodeState, live map[int]Result, k int) []int {
			call++
			return o.pick(n, live, placed[call-1], k)
		}, w, uint64(seed+1), w.steps).share()
	}
	return out
}

// expectedRequests is the expected number of multi-GPU requests of a
// family's sequence on n GPUs, failed ones included (the denominator of
// the share). It does not depend on the placements: which job ends next
// and whether a request fits depend only on the sizes of the running
// jobs, the state here.
func expectedRequests(n int, w workload) float64 {
	sizeP := sizeProbs(w, n)
	memo := make([]map[string]float64, w.steps+1)
	var val func(t int, sizes []uint8) float64
	val = func(t int, sizes []uint8) float64 {
		if t == 0 {
			return 0
		}
		if memo[t] == nil {
			memo[t] = map[string]float64{}
		}
		if v, ok := memo[t][string(sizes)]; ok {
			return v
		}
		used := 0
		for _, s := range sizes {
			used += int(s)
		}
		v := churnStep(w, sizeP, len(sizes), n-used, func() float64 {
			var ends float64
			for i := range sizes {
				ends += val(t-1, slices.Delete(slices.Clone(sizes), i, i+1))
			}
			return ends
		}, func(k int) float64 {
			q := 0.0
			if k >= 2 {
				q = 1
			}
			if k > n-used {
				return q + val(t-1, sizes)
			}
			next := append(slices.Clone(sizes), uint8(k))
			slices.Sort(next)
			return q + val(t-1, next)
		})
		memo[t][string(sizes)] = v
		return v
	}
	return val(w.steps, nil)
}

// expectedShareMC estimates a placement rule's expected ideal placements
// over expected multi-GPU requests from mcSeeds sequences (seeds past the
// table's) as the ratio of the sums, with its standard error.
func expectedShareMC(tb testing.TB, topo *topology.Topology, w workload, pick func(*NodeState, int) []int) (share, se float64) {
	tb.Helper()
	ideal := make([]float64, mcSeeds)
	multi := make([]float64, mcSeeds)
	var si, sm float64
	for i := range mcSeeds {
		st := playChurn(tb, topo, pick, w, uint64(1000+i), w.steps)
		ideal[i], multi[i] = float64(st.ideal), float64(st.multi)
		si += ideal[i]
		sm += multi[i]
	}
	share = si / sm
	// The ratio estimator's standard error (delta method).
	var ss float64
	for i := range ideal {
		r := ideal[i] - share*multi[i]
		ss += r * r
	}
	mm := sm / mcSeeds
	return share, math.Sqrt(ss/(mcSeeds-1)) / mm / math.Sqrt(mcSeeds)
}

// mcSeeds is how many sequences expectedShareMC plays.
const mcSeeds = 3000

// groupedMaxGroups bounds the groups of the nodes the grouped model runs
// on: its states grow with them (8 NVLink islands of 4 GPUs have millions
// within a few steps), and a job's row holds 4 bits per group.
const groupedMaxGroups = 4

// groupModel is a node whose ideal classes, for the sizes of a mix, are
// "all in one group": the groups (PCIe switches, NVLink islands) are the
// components of the pairs on the ideal class of a pair, and a set of any
// size of the mix is on its ideal class exactly when it lies in one
// group. There the free GPUs of a group are interchangeable for the
// measure, and so are groups of one size: the online optimum is computed
// over jobs as counts per group, up to the order of the groups, which
// makes a node of 16 GPUs in 4 switches tractable.
type groupModel struct {
	groupOf []int // per position
	members [][]int
}

// groupsOf returns topo's groups for mix's sizes, or false when the ideal
// classes are not "in one group" (a hybrid cube mesh, a quad whose ideal
// class spans two switches).
func groupsOf(topo *topology.Topology, mix []float64) (*groupModel, bool) {
	n := topo.Len()
	ideal := idealClasses(topo)
	g := &groupModel{groupOf: make([]int, n)}
	for p := range g.groupOf {
		g.groupOf[p] = -1
	}
	for p := range n {
		if g.groupOf[p] >= 0 {
			continue
		}
		id := len(g.members)
		g.members = append(g.members, nil)
		stack := []int{p}
		g.groupOf[p] = id
		for len(stack) > 0 {
			a := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			g.members[id] = append(g.members[id], a)
			for b := range n {
				if g.groupOf[b] < 0 && setKey(topo, 1<<a|1<<b).link() >= ideal[2] {
					g.groupOf[b] = id
					stack = append(stack, b)
				}
			}
		}
	}
	// Groups by size, so that a canonical state (which orders groups by
	// size first) has the sizes in the same order.
	slices.SortStableFunc(g.members, func(a, b []int) int { return len(a) - len(b) })
	for id, members := range g.members {
		for _, p := range members {
			g.groupOf[p] = id
		}
	}
	for k, wk := range mix {
		if k < 2 || wk == 0 || k > n {
			continue
		}
		ok := true
		forEachSubset(positions(fullMask(n)), k, func(set []int) {
			s := maskOf(set)
			ok = ok && (setKey(topo, s).link() >= ideal[k]) == g.oneGroup(s)
		})
		if !ok {
			return nil, false
		}
	}
	return g, true
}

func (g *groupModel) oneGroup(s uint64) bool {
	first := g.groupOf[bits.TrailingZeros64(s)]
	for ; s != 0; s &= s - 1 {
		if g.groupOf[bits.TrailingZeros64(s)] != first {
			return false
		}
	}
	return true
}

// groupedMaxJobs bounds the jobs of a grouped state: one per GPU of a
// node of at most 16.
const groupedMaxJobs = 16

// groupedState is the running jobs of a grouped node, each a row of GPU
// counts per group (4 bits per group), zero rows last.
type groupedState [groupedMaxJobs]uint16

func (s groupedState) count() int {
	for i, r := range s {
		if r == 0 {
			return i
		}
	}
	return len(s)
}

func rowCount(row uint16, group int) int { return int(row >> (4 * group) & 0xf) }

// groupedMDP is onlineMDP over a groupModel: its states are the jobs as
// counts per group, up to the order of the jobs and of groups of one
// size.
type groupedMDP struct {
	g     *groupModel
	w     workload
	sizeP []float64
	value []map[groupedState]float64
}

func newGroupedMDP(g *groupModel, n int, w workload, steps int) *groupedMDP {
	m := &groupedMDP{g: g, w: w, sizeP: sizeProbs(w, n), value: make([]map[groupedState]float64, steps+1)}
	for t := range m.value {
		m.value[t] = map[groupedState]float64{}
	}
	return m
}

// canonical is s's representative among the states equal to it up to the
// order of its jobs and of groups of one size: groups ordered by a
// signature that does not depend on their order (their size first), every
// order of groups with equal signatures tried, jobs sorted, the least
// result taken. The signature only prunes the orders tried; any function
// of a group's size and contents would give the same representative.
func (m *groupedMDP) canonical(s groupedState) groupedState {
	ng := len(m.g.members)
	jobs := s.count()
	var sig [groupedMaxGroups]uint64
	for c := range ng {
		sig[c] = uint64(len(m.g.members[c])) << 48
		for _, r := range s[:jobs] {
			if x := uint64(rowCount(r, c)); x > 0 {
				total := uint64(0)
				for c2 := range ng {
					total += uint64(rowCount(r, c2))
				}
				sig[c] += x*x*1009 + x*total*31 + 1
			}
		}
	}
	cols := []int{0, 1, 2, 3}[:ng]
	slices.SortStableFunc(cols, func(a, b int) int { return cmp.Compare(sig[a], sig[b]) })
	best := groupedState{}
	first := true
	var try func(i int)
	try = func(i int) {
		if i == ng {
			var out groupedState
			for j, r := range s[:jobs] {
				var nr uint16
				for k, c := range cols {
					nr |= uint16(rowCount(r, c)) << (4 * k)
				}
				out[j] = nr
			}
			slices.SortFunc(out[:jobs], func(a, b uint16) int { return int(b) - int(a) })
			if first || slices.Compare(out[:], best[:]) < 0 {
				best, first = out, false
			}
			return
		}
		// Every group of the block of equal signatures starting at i
		// takes position i in turn.
		for j := i; j < ng && sig[cols[j]] == sig[cols[i]]; j++ {
			cols[i], cols[j] = cols[j], cols[i]
			try(i + 1)
			cols[i], cols[j] = cols[j], cols[i]
		}
	}
	try(0)
	return best
}

func (m *groupedMDP) free(s groupedState) [groupedMaxGroups]int {
	var out [groupedMaxGroups]int
	for c := range m.g.members {
		out[c] = len(m.g.members[c])
		for _, r := range s[:s.count()] {
			out[c] -= rowCount(r, c)
		}
	}
	return out
}

func (m *groupedMDP) val(t int, s groupedState) float64 {
	if t == 0 {
		return 0
	}
	s = m.canonical(s)
	if v, ok := m.value[t][s]; ok {
		return v
	}
	freeN := 0
	for _, f := range m.free(s) {
		freeN += f
	}
	jobs := s.count()
	v := churnStep(m.w, m.sizeP, jobs, freeN, func() float64 {
		var ends float64
		for i := range jobs {
			next := s
			copy(next[i:jobs], next[i+1:jobs])
			next[jobs-1] = 0
			ends += m.val(t-1, next)
		}
		return ends
	}, func(size int) float64 {
		if size > freeN {
			return m.val(t-1, s)
		}
		_, q := m.choose(t, s, size)
		return q
	})
	m.value[t][s] = v
	return v
}

// choose is the best row (counts per group) for a request of size GPUs
// with t steps left, and the expected ideal placements from here with it.
func (m *groupedMDP) choose(t int, s groupedState, size int) (uint16, float64) {
	free := m.free(s)
	ng := len(m.g.members)
	jobs := s.count()
	var best uint16
	bestV := -1.0
	var rec func(c, left int, row uint16, groups int)
	rec = func(c, left int, row uint16, groups int) {
		if c == ng {
			if left > 0 {
				return
			}
			next := s
			next[jobs] = row
			v := m.val(t-1, next)
			if size >= 2 && groups == 1 {
				v++
			}
			if v > bestV+1e-9 {
				best, bestV = row, v
			}
			return
		}
		for x := min(free[c], left); x >= 0; x-- {
			g := groups
			if x > 0 {
				g++
			}
			rec(c+1, left-x, row|uint16(x)<<(4*c), g)
		}
	}
	rec(0, size, 0, 0)
	return best, bestV
}

// state is the running jobs of live as counts per group.
func (m *groupedMDP) state(live map[int]Result) groupedState {
	var s groupedState
	i := 0
	for _, r := range live {
		for _, p := range r.GPUs {
			s[i] += 1 << (4 * m.g.groupOf[p])
		}
		i++
	}
	return s
}

// gpus takes, per group, as many of its lowest free positions as row
// says: the GPUs of one group are interchangeable for the measure.
func (m *groupedMDP) gpus(n *NodeState, row uint16) []int {
	free := freeMask(n)
	var out []int
	for c, members := range m.g.members {
		x := rowCount(row, c)
		for _, p := range members {
			if x == 0 {
				break
			}
			if free&(1<<p) != 0 {
				out = append(out, p)
				x--
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestOnlineOptimumModelsAgree solves nodes both models apply to (two
// PCIe switches of 3 and 4 GPUs, an NVSwitch node, four bridged pairs,
// four switches of two, switches of 4, 4 and 2)
// with each: the grouped model's symmetries must not change the optimum.
func TestOnlineOptimumModelsAgree(t *testing.T) {
	short := func(w workload) workload { w.steps = 30; return w }
	cases := []struct {
		topo string
		w    workload
	}{
		{"p40-pcie-7", short(churnFamilies[0])},
		{"dgx-a100", short(churnFamilies[0])},
		{"pcie-nvbridge-8", short(churnFamilies[4])}, // pairs-high: a pair's ideal class is its bridge
		{"pcie-switch-8", short(churnFamilies[4])},   // four switches of 2
		// Groups of 4, 4 and 2 GPUs, listed by the node in another order
		// than the grouped model's; 8 steps keep the general model quick.
		{"pcie-plx-10-single-root", func(w workload) workload { w.steps = 8; return w }(churnFamilies[0])},
	}
	tops := map[string]*topology.Topology{}
	for _, nt := range churnTopologies(t) {
		tops[nt.name] = nt.topo
	}
	for _, c := range cases {
		t.Run(c.topo+"/"+c.w.name, func(t *testing.T) {
			topo := tops[c.topo]
			g, ok := groupsOf(topo, c.w.mix)
			if !ok {
				t.Fatalf("%s has no groups for %s", c.topo, c.w.name)
			}
			grouped := newGroupedMDP(g, topo.Len(), c.w, c.w.steps).val(c.w.steps, groupedState{})
			general := newOnlineMDP(topo, c.w, c.w.steps).val(c.w.steps, jobsState{})
			if math.Abs(grouped-general) > 1e-9 {
				t.Errorf("expected ideal placements: grouped %.9f, general %.9f", grouped, general)
			}
			if general <= 0 {
				t.Errorf("expected ideal placements %.9f, want some", general)
			}
		})
	}
}

// TestGroupsOf checks which nodes the grouped model takes: switches and
// NVLink islands whose sets are ideal exactly within one, not a hybrid
// cube mesh or a node whose ideal quad spans two switches.
func TestGroupsOf(t *testing.T) {
	want := map[string][]int{ // group sizes for the family, nil: none
		"pcie-16":                 {4, 4, 4, 4},
		"pcie-plx-10-single-root": {2, 4, 4},
		"p40-pcie-7":              {3, 4},
		"nvlink-tiered-32":        {4, 4, 4, 4, 4, 4, 4, 4},
		"dgx-h100":                {8},
		"dgx1-v100":               nil,
		"pcie-switch-8":           nil, // pairs in a switch, quads in a socket
	}
	for _, nt := range churnTopologies(t) {
		sizes, ok := want[nt.name]
		if !ok {
			continue
		}
		g, grouped := groupsOf(nt.topo, churnFamilies[0].mix)
		var got []int
		if grouped {
			for _, m := range g.members {
				got = append(got, len(m))
			}
		}
		if !slices.Equal(got, sizes) {
			t.Errorf("%s: groups of %v, want %v", nt.name, got, sizes)
		}
	}
}

// TestExpectedRequestsMatchesSequences compares the exact expected count
// of multi-GPU requests with the mean over mcSeeds drawn sequences.
func TestExpectedRequestsMatchesSequences(t *testing.T) {
	for _, n := range []int{4, 8, 16} {
		w := churnFamilies[0]
		var xs []float64
		for i := range mcSeeds {
			c := 0
			for _, o := range churnOps(w, n, uint64(1000+i), w.steps) {
				if o.size >= 2 {
					c++
				}
			}
			xs = append(xs, float64(c))
		}
		m := mean(xs)
		var ss float64
		for _, x := range xs {
			ss += (x - m) * (x - m)
		}
		se := math.Sqrt(ss/float64(len(xs)-1)) / math.Sqrt(float64(len(xs)))
		if got := expectedRequests(n, w); math.Abs(got-m) > 4*se {
			t.Errorf("%d GPUs: expected %.3f multi-GPU requests, the sequences have %.3f ± %.3f", n, got, m, se)
		}
	}
}

// TestOnlineOptimumBeatsEveryPolicy checks the optimum against the
// placement rules of the family table on nodes where they differ: no rule's
// expected share (over mcSeeds sequences) is above the optimum's beyond
// noise, and first fit is well below it.
func TestOnlineOptimumBeatsEveryPolicy(t *testing.T) {
	w := churnFamilies[0]
	for _, nt := range churnTopologies(t) {
		if nt.name != "dgx1-v100" && nt.name != "pcie-plx-10-single-root" {
			continue
		}
		t.Run(nt.name, func(t *testing.T) {
			t.Parallel()
			o := newOnlineOptimum(nt.topo, w)
			opt := o.expected() / expectedRequests(nt.topo.Len(), w)
			for _, a := range familyPolicies(w) {
				share, se := expectedShareMC(t, nt.topo, w, a.pick)
				if share > opt+3*se {
					t.Errorf("%s's expected share %.4f ± %.4f is above the optimum's %.4f", a.name, share, se, opt)
				}
				if a.name == "first-fit" && share > opt-0.1 {
					t.Errorf("first fit's expected share %.4f is within 0.1 of the optimum's %.4f", share, opt)
				}
			}
		})
	}
}
