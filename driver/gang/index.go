package gang

import (
	"cmp"
	"slices"
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
// level, then the demand kept, then the tighter fit, then the alignment's
// name.
func (c *choice) better(o *choice) bool {
	if c.k != o.k {
		return c.k > o.k
	}
	if c.level != o.level {
		return c.level < o.level
	}
	if c.future != o.future {
		return c.future > o.future
	}
	if c.leftSlots != o.leftSlots {
		return c.leftSlots < o.leftSlots
	}
	if c.leftFree != o.leftFree {
		return c.leftFree < o.leftFree
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
// that holds them, or nil. With a demand (future), the domain that keeps
// the most of it placeable wins first (doc.go, criterion 3), then the
// best fit.
func (ix *index) best(k, maxLevel, gpusPerPod int, fut *future) *choice {
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
		var win *choice
		var winCand *candidate
		for ci := range cands {
			cd := &cands[ci]
			if fut == nil && winCand != nil && !ix.fitsBetter(lv, cd, winCand) {
				continue
			}
			c := &choice{k: k, level: lv, value: cd.value, leftSlots: cd.slots - k, leftFree: cd.free - k*gpusPerPod}
			if fut == nil {
				win, winCand = c, cd
				continue
			}
			if lv == 0 {
				c.takes = []take{{node: cd.first, pods: k}}
			} else {
				ix.fill(cd.nodes, lv, k, &c.takes)
			}
			c.future = fut.keeps(ix, c.takes, gpusPerPod)
			if win == nil || c.future > win.future || c.future == win.future && ix.fitsBetter(lv, cd, winCand) {
				win, winCand = c, cd
			}
		}
		if win.takes == nil {
			if lv == 0 {
				win.takes = []take{{node: winCand.first, pods: k}}
			} else {
				ix.fill(winCand.nodes, lv, k, &win.takes)
			}
		}
		return win
	}
	return nil
}

// fitsBetter: best fit, the domain that keeps the fewest slots, then the
// fewest free GPUs (both would be stranded around the gang, or kept whole
// elsewhere); then the busiest enclosing domains, level by level upwards,
// so that idle parents stay idle; then the value.
func (ix *index) fitsBetter(lv int, a, b *candidate) bool {
	if a.slots != b.slots {
		return a.slots < b.slots
	}
	if a.free != b.free {
		return a.free < b.free
	}
	for pl := lv + 1; pl <= ix.labels; pl++ {
		fa, fb := ix.parentFree(pl, a.first), ix.parentFree(pl, b.first)
		if fa != fb {
			return fa < fb
		}
	}
	return a.value < b.value
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
// slots), keeping its largest subdomains whole: subdomains are used in
// increasing order of slots (then free GPUs), each up to what is left, so
// partly used ones are finished first and only the last one used, the
// smallest that holds the rest, is left partly used; the largest are
// broken last or not at all.
func (ix *index) fill(nodes []int, lv, k int, out *[]take) {
	if lv == 0 || len(nodes) == 1 {
		*out = append(*out, take{node: nodes[0], pods: k})
		return
	}
	for _, c := range ix.children(nodes, lv-1) {
		if k == 0 {
			return
		}
		n := min(k, c.slots)
		ix.fill(c.nodes, lv-1, n, out)
		k -= n
	}
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
