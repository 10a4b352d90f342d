package gang

// Shape is a gang shape asked for lately, with how many times: the
// demand Place keeps room for (Request.Demand).
type Shape struct {
	Pods       int
	GPUsPerPod int
	Count      int
}

// future is the demand as Place weighs it: per shape, the lowest level
// its gangs can span on this cluster (from the nodes' total GPUs: its
// minimal link class) and how many of them fit now, each in one domain
// of that level.
type future struct {
	shapes []fshape
}

type fshape struct {
	pods, g, count, level int
	gpus                  int64
	before                int // gangs of the shape that fit now
	dslots                []int
	total                 int
}

// newFuture prepares the demand; nil without one.
func newFuture(ix *index, demand []Shape) *future {
	if len(demand) == 0 {
		return nil
	}
	f := &future{}
	if ix.most == nil {
		ix.most = map[int][]int{}
	}
	for _, d := range demand {
		s := fshape{pods: d.Pods, g: max(d.GPUsPerPod, 1), count: d.Count, gpus: int64(d.Pods) * int64(max(d.GPUsPerPod, 1))}
		s.level = ix.minimalLevel(s.pods, s.g, ix.most)
		switch {
		case s.level == 0:
			for i := range ix.nodes {
				s.before += ix.nodes[i].FreeGPUs / s.g / s.pods
			}
		case s.level <= ix.labels:
			s.dslots = make([]int, len(ix.levels[s.level]))
			for i := range ix.nodes {
				sl := ix.nodes[i].FreeGPUs / s.g
				if d := ix.nodeDomain[s.level][i]; d >= 0 {
					s.dslots[d] += sl
				} else {
					s.before += sl / s.pods
				}
			}
			for _, sl := range s.dslots {
				s.before += sl / s.pods
			}
		default:
			for i := range ix.nodes {
				s.total += ix.nodes[i].FreeGPUs / s.g
			}
			s.before = s.total / s.pods
		}
		f.shapes = append(f.shapes, s)
	}
	return f
}

// minimalLevel is the lowest level with a domain whose GPUs, all free,
// would hold pods pods of g GPUs. most caches, per g, the most pods of g
// GPUs one domain of each level holds.
func (ix *index) minimalLevel(pods, g int, most map[int][]int) int {
	m, ok := most[g]
	if !ok {
		m = make([]int, ix.labels+1)
		for i := range ix.nodes {
			m[0] = max(m[0], ix.nodes[i].TotalGPUs/g)
		}
		for lv := 1; lv <= ix.labels; lv++ {
			m[lv] = m[0] // a node without the label is alone
			for _, d := range ix.levels[lv] {
				sum := 0
				for _, i := range d.nodes {
					sum += ix.nodes[i].TotalGPUs / g
				}
				m[lv] = max(m[lv], sum)
			}
		}
		most[g] = m
	}
	for lv, n := range m {
		if n >= pods {
			return lv
		}
	}
	return ix.labels + 1
}

// keeps scores a placement by the demand it leaves placeable: the sum
// over shapes of the shape's GPUs times the gangs of it that still fit on
// its minimal level, counting no more gangs than were asked for lately
// (room for more of a shape than comes is worth nothing). Larger is
// better: the shapes asked for most keep their link class, for as many
// gangs as come, as the in-node allocator's criterion 2 does for GPU sets.
func (f *future) keeps(ix *index, takes []take, gpusPerPod int) int64 {
	var score int64
	type lost struct{ d, n int }
	var byDomain []lost
	for si := range f.shapes {
		s := &f.shapes[si]
		after := s.before
		switch {
		case s.level == 0:
			for _, t := range takes {
				free := ix.nodes[t.node].FreeGPUs
				after += (free-t.pods*gpusPerPod)/s.g/s.pods - free/s.g/s.pods
			}
		case s.level <= ix.labels:
			byDomain = byDomain[:0]
			for _, t := range takes {
				free := ix.nodes[t.node].FreeGPUs
				n := free/s.g - (free-t.pods*gpusPerPod)/s.g
				d := ix.nodeDomain[s.level][t.node]
				if d < 0 {
					after += (free/s.g-n)/s.pods - free/s.g/s.pods
					continue
				}
				found := false
				for k := range byDomain {
					if byDomain[k].d == d {
						byDomain[k].n += n
						found = true
						break
					}
				}
				if !found {
					byDomain = append(byDomain, lost{d, n})
				}
			}
			for _, l := range byDomain {
				after += (s.dslots[l.d]-l.n)/s.pods - s.dslots[l.d]/s.pods
			}
		default:
			n := 0
			for _, t := range takes {
				free := ix.nodes[t.node].FreeGPUs
				n += free/s.g - (free-t.pods*gpusPerPod)/s.g
			}
			after = (s.total - n) / s.pods
		}
		score += s.gpus * int64(min(after, s.count))
	}
	return score
}
