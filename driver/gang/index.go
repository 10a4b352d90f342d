package gang

import (
	"cmp"
	"slices"
	"sort"
)

// index is the nodes grouped into domains per level, for one alignment.
type index struct {
	h      *Hierarchy
	nodes  []Node
	slots  []int
	labels int // levels 1..labels carry label keys; labels+1 is the cluster
	// levels[lv] (1..labels) are the domains of level lv, by value;
	// nodeDomain[lv][i] is node i's domain there, -1 without the label.
	levels     [][]domain
	nodeDomain [][]int
	total      int
	// minimal is the minimal level of the gang being filled (the lowest
	// level one domain of the idle cluster could hold it in): fill packs
	// the subdomains of that level and above fragments first (fill).
	minimal int
	// most caches minimalLevel's per-level capacities, per GPUs per pod.
	most map[int][]int
}

type domain struct {
	value string
	nodes []int
	slots int
	free  int
}

// take is pods placed on one node (by index).
type take struct {
	node, pods int
}

// choice is a candidate placement of k pods within one domain.
type choice struct {
	k         int
	level     int
	value     string
	alignment string
	// future is the demand the placement keeps placeable (future.keeps);
	// leftSlots and leftFree are the domain's slots and free GPUs left
	// after the placement: best fit takes the domain that keeps least.
	future              int64
	leftSlots, leftFree int
	takes               []take
}

// better orders choices of different alignments: more pods, then the lower
// level, then the tighter fit, then the demand kept, then the alignment's
// name.
func (c *choice) better(o *choice) bool {
	if c.k != o.k {
		return c.k > o.k
	}
	if c.level != o.level {
		return c.level < o.level
	}
	if c.leftSlots != o.leftSlots {
		return c.leftSlots < o.leftSlots
	}
	if c.leftFree != o.leftFree {
		return c.leftFree < o.leftFree
	}
	if c.future != o.future {
		return c.future > o.future
	}
	return c.alignment < o.alignment
}

func newIndex(h *Hierarchy, nodes []Node, alignment string, aligned bool) *index {
	ix := &index{h: h, nodes: nodes, labels: h.Cluster() - 1}
	ix.slots = make([]int, len(nodes))
	for i := range nodes {
		s := nodes[i].Slots
		if aligned {
			s = nodes[i].AlignedSlots[alignment]
		}
		ix.slots[i] = s
		ix.total += s
	}
	ix.levels = make([][]domain, ix.labels+1)
	ix.nodeDomain = make([][]int, ix.labels+1)
	for lv := 1; lv <= ix.labels; lv++ {
		byValue := map[string]int{}
		nd := make([]int, len(nodes))
		var ds []domain
		for i := range nodes {
			v := nodes[i].domain(lv)
			if v == "" {
				nd[i] = -1
				continue
			}
			d, ok := byValue[v]
			if !ok {
				d = len(ds)
				byValue[v] = d
				ds = append(ds, domain{value: v})
			}
			nd[i] = d
			ds[d].nodes = append(ds[d].nodes, i)
			ds[d].slots += ix.slots[i]
			ds[d].free += nodes[i].FreeGPUs
		}
		ix.levels[lv], ix.nodeDomain[lv] = ds, nd
	}
	return ix
}

// domain is the node's label value at level lv (1..labels).
func (n *Node) domain(lv int) string {
	if lv-1 < len(n.Domains) {
		return n.Domains[lv-1]
	}
	return ""
}

// candidate is one domain of a level that may hold the gang.
type candidate struct {
	value string
	nodes []int
	slots int
	free  int
	first int // the first node, whose parents break ties
}

// best is the placement of k pods within the lowest level up to maxLevel
// that holds them, or nil: the best fit there, then, with a demand
// (future), the domain that keeps the most of it placeable (doc.go,
// criterion 4), then tieBetter.
func (ix *index) best(k, maxLevel, gpusPerPod int, fut *future) *choice {
	if ix.most == nil {
		ix.most = map[int][]int{}
	}
	ix.minimal = ix.minimalLevel(k, max(gpusPerPod, 1), ix.most)
	var cands []candidate
	for lv := 0; lv <= maxLevel; lv++ {
		cands = cands[:0]
		switch {
		case lv == 0:
			for i := range ix.nodes {
				if ix.slots[i] >= k {
					cands = append(cands, candidate{value: ix.nodes[i].Name, slots: ix.slots[i], free: ix.nodes[i].FreeGPUs, first: i})
				}
			}
		case lv <= ix.labels:
			for _, d := range ix.levels[lv] {
				if d.slots >= k {
					cands = append(cands, candidate{value: d.value, nodes: d.nodes, slots: d.slots, free: d.free, first: d.nodes[0]})
				}
			}
		default:
			if ix.total >= k {
				all := make([]int, len(ix.nodes))
				free := 0
				for i := range all {
					all[i] = i
					free += ix.nodes[i].FreeGPUs
				}
				cands = append(cands, candidate{nodes: all, slots: ix.total, free: free})
			}
		}
		if len(cands) == 0 {
			continue
		}
		// Best fit first; the demand kept only among the domains that fit
		// equally well, so only those are filled ahead of the choice.
		bi := 0
		for ci := 1; ci < len(cands); ci++ {
			if fitsTighter(&cands[ci], &cands[bi]) {
				bi = ci
			}
		}
		var win *choice
		var winCand *candidate
		for ci := range cands {
			cd := &cands[ci]
			if cd.slots != cands[bi].slots || cd.free != cands[bi].free {
				continue
			}
			c := &choice{k: k, level: lv, value: cd.value, leftSlots: cd.slots - k, leftFree: cd.free - k*gpusPerPod}
			if fut != nil {
				ix.fillCandidate(cd, lv, k, &c.takes)
				c.future = fut.keeps(ix, c.takes, gpusPerPod)
			}
			if win == nil || c.future > win.future || c.future == win.future && ix.tieBetter(lv, cd, winCand) {
				win, winCand = c, cd
			}
		}
		if win.takes == nil {
			ix.fillCandidate(winCand, lv, k, &win.takes)
		}
		return win
	}
	return nil
}

// fitsTighter is best fit: the domain that keeps the fewest slots after
// the gang, then the fewest free GPUs (both would be stranded around the
// gang, or kept whole elsewhere).
func fitsTighter(a, b *candidate) bool {
	if a.slots != b.slots {
		return a.slots < b.slots
	}
	return a.free < b.free
}

// tieBetter breaks ties of best fit (and of the demand kept): the busiest
// enclosing domains, level by level upwards, so that idle parents stay
// idle; then the value.
func (ix *index) tieBetter(lv int, a, b *candidate) bool {
	for pl := lv + 1; pl <= ix.labels; pl++ {
		fa, fb := ix.parentFree(pl, a.first), ix.parentFree(pl, b.first)
		if fa != fb {
			return fa < fb
		}
	}
	return a.value < b.value
}

// fillCandidate places k pods in the candidate domain of level lv.
func (ix *index) fillCandidate(cd *candidate, lv, k int, out *[]take) {
	if lv == 0 {
		*out = append(*out, take{node: cd.first, pods: k})
		return
	}
	ix.fill(cd.nodes, lv, k, out)
}

// parentFree is the free GPUs of node i's domain at level pl (the node's
// own when it lacks the label).
func (ix *index) parentFree(pl, i int) int {
	if d := ix.nodeDomain[pl][i]; d >= 0 {
		return ix.levels[pl][d].free
	}
	return ix.nodes[i].FreeGPUs
}

// child is a subdomain met while filling a domain.
type child struct {
	key   string
	nodes []int
	slots int
	free  int
}

// fill places k pods on nodes (a domain of level lv, holding at least k
// slots), level by level down; at each level the last subdomain used is
// the best fit for the rest (the smallest that holds it). Before it:
//   - subdomains below the gang's minimal level (ix.minimal) are used up
//     largest first: the fewest of them, so fewer hops across them for
//     the gang's collectives, and the subdomains it uses up are freed
//     together when it ends, whole for the gangs after it;
//   - subdomains at or above it, which a gang spans only where no domain
//     of its minimal level holds it now (relaxed under Preferred, or a
//     Required level above the minimal one), are used up smallest first
//     (then the fewest free GPUs): the gang takes the fragments the
//     others left, and the domains closest to holding a gang of its size
//     whole stay so for the next one, which then lands on its minimal
//     level (measured: docs/performance/gangs.md).
func (ix *index) fill(nodes []int, lv, k int, out *[]take) {
	if lv == 0 || len(nodes) == 1 {
		*out = append(*out, take{node: nodes[0], pods: k})
		return
	}
	// A level none of these nodes carries a label of groups nothing:
	// the subdomains are those of the next level down.
	cl := lv - 1
	for cl > 0 && !ix.labelled(nodes, cl) {
		cl--
	}
	cs := ix.children(nodes, cl)
	for k > 0 && len(cs) > 0 {
		// The best fit for the rest: the fewest slots that hold it, then
		// the fewest free GPUs, then the key (cs is in that order).
		if j := sort.Search(len(cs), func(j int) bool { return cs[j].slots >= k }); j < len(cs) {
			ix.fill(cs[j].nodes, cl, k, out)
			return
		}
		// Else use one up: at or above the gang's minimal level the
		// smallest (the fewest slots, then the fewest free GPUs, then the
		// key: cs[0]); below it the largest (the most slots, then the
		// fewest free GPUs left stranded beside them, then the key).
		u := 0
		if cl < ix.minimal {
			u = len(cs) - 1
			for j := len(cs) - 2; j >= 0 && cs[j].slots == cs[u].slots; j-- {
				u = j // same slots, fewer or as many free GPUs, lower key
			}
		}
		ix.fill(cs[u].nodes, cl, cs[u].slots, out)
		k -= cs[u].slots
		cs = slices.Delete(cs, u, u+1)
	}
}

// labelled tells whether any of nodes carries level lv's label.
func (ix *index) labelled(nodes []int, lv int) bool {
	for _, i := range nodes {
		if ix.nodeDomain[lv][i] >= 0 {
			return true
		}
	}
	return false
}

// children groups nodes by their domain at level cl (each node alone at
// level 0 or without the label), the ones with slots only, sorted by
// slots, free GPUs and key.
func (ix *index) children(nodes []int, cl int) []child {
	var cs []child
	if cl == 0 {
		for _, i := range nodes {
			if ix.slots[i] > 0 {
				cs = append(cs, child{key: ix.nodes[i].Name, nodes: []int{i}, slots: ix.slots[i], free: ix.nodes[i].FreeGPUs})
			}
		}
	} else {
		pos := map[int]int{}
		for _, i := range nodes {
			if ix.slots[i] == 0 {
				continue
			}
			d := ix.nodeDomain[cl][i]
			if d < 0 {
				cs = append(cs, child{key: "\x00" + ix.nodes[i].Name, nodes: []int{i}, slots: ix.slots[i], free: ix.nodes[i].FreeGPUs})
				continue
			}
			p, ok := pos[d]
			if !ok {
				p = len(cs)
				pos[d] = p
				cs = append(cs, child{key: ix.levels[cl][d].value})
			}
			cs[p].nodes = append(cs[p].nodes, i)
			cs[p].slots += ix.slots[i]
			cs[p].free += ix.nodes[i].FreeGPUs
		}
	}
	slices.SortFunc(cs, func(a, b child) int {
		return cmp.Or(cmp.Compare(a.slots, b.slots), cmp.Compare(a.free, b.free), cmp.Compare(a.key, b.key))
	})
	return cs
}

// mostIn is the most slots one domain of level holds.
func (ix *index) mostIn(level int) int {
	if level > ix.labels {
		return ix.total
	}
	most := 0
	for i, s := range ix.slots {
		if level == 0 || ix.nodeDomain[level][i] < 0 {
			most = max(most, s)
		}
	}
	if level > 0 {
		for _, d := range ix.levels[level] {
			most = max(most, d.slots)
		}
	}
	return most
}

// countDomains is the number of domains of level the choice's nodes are
// in (a node without the label counts alone).
func (ix *index) countDomains(c *choice, level int) int {
	if level > ix.labels {
		return 1
	}
	seen := map[int]struct{}{}
	n := 0
	for _, t := range c.takes {
		if level == 0 {
			n++
			continue
		}
		d := ix.nodeDomain[level][t.node]
		if d < 0 {
			n++
			continue
		}
		if _, ok := seen[d]; !ok {
			seen[d] = struct{}{}
			n++
		}
	}
	return n
}

func (ix *index) placement(c *choice, req Request) *Placement {
	p := &Placement{Gang: req.Name, Level: c.level, LevelName: ix.h.Name(c.level), Domain: c.value, Alignment: c.alignment}
	p.Nodes = make([]string, 0, c.k)
	for _, t := range c.takes {
		for range t.pods {
			p.Nodes = append(p.Nodes, ix.nodes[t.node].Name)
		}
	}
	return p
}
