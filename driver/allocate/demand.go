package allocate

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/gpulink/gpulink/driver/topology"
)

// DemandShape is one kind of GPU pod, as the stranding criterion weighs
// what a node could still take: whole GPUs (GPUs >= 1, ShareMilli 0) or a
// share of one GPU (GPUs 1, ShareMilli 1..999, the larger of its memory
// and compute fractions in thousandths), and the CPU and memory the pod
// asks for besides. Products, when not empty, is the GPU products the
// pod may run on (the node's Topology.GPUs[0].ProductName, the product a
// claim's selector admits), sorted and joined by "|": a node of another
// product cannot run the shape, whatever it has left.
type DemandShape struct {
	GPUs       int
	ShareMilli int
	Host       Host
	Products   string
}

// ProductsKey is the DemandShape.Products of a pod that may run on the
// given products: sorted, duplicates dropped, joined by "|" ("" for any).
func ProductsKey(products []string) string {
	if len(products) == 0 {
		return ""
	}
	p := slices.Clone(products)
	slices.Sort(p)
	return strings.Join(slices.Compact(p), "|")
}

func (s DemandShape) validate() error {
	switch {
	case s.GPUs < 1 || s.GPUs > topology.MaxGPUs:
		return fmt.Errorf("demand shape: gpus must be 1..%d, got %d", topology.MaxGPUs, s.GPUs)
	case s.ShareMilli < 0 || s.ShareMilli >= milliPerGPU:
		return fmt.Errorf("demand shape: shareMilli must be 0..%d, got %d", milliPerGPU-1, s.ShareMilli)
	case s.ShareMilli > 0 && s.GPUs != 1:
		return fmt.Errorf("demand shape: a share is of one GPU, got gpus=%d", s.GPUs)
	case s.Products != "" && s.Products != ProductsKey(strings.Split(s.Products, "|")):
		return fmt.Errorf("demand shape: products must be sorted, distinct and joined by |, got %q", s.Products)
	case slices.Contains(strings.Split(s.Products, "|"), "") && s.Products != "":
		return fmt.Errorf("demand shape: products %q names an empty product", s.Products)
	}
	return s.Host.validate("demand shape")
}

// perGPU is what the shape needs of each GPU it uses, in milli GPU.
func (s DemandShape) perGPU() int32 {
	if s.ShareMilli > 0 {
		return int32(s.ShareMilli)
	}
	return milliPerGPU
}

const milliPerGPU = 1000

// maxDemandShapes bounds the shapes a DemandMix weighs: the stranding
// criterion costs shapes x GPUs per node scored. It is above what a
// DemandHistory of DefaultHistoryWindow pods can hold with the task
// classes of FGD's lists known besides (535 in default-spec33u), so that
// no shape is dropped: the rare shapes are the ones that matter when pods
// are pinned to GPU products. Each pinned product makes its own shapes,
// each seen a few times, and a bound of 128 most frequent shapes dropped
// most of them (default-spec33, one seed: 0.15 / 0.23 / 0.38 % of the
// GPUs unallocated at 70 / 80 / 90 % arrived with 128, none with every
// shape kept: the pods that may run anywhere no longer took the CPU-poor
// V100 nodes whose pinned pods went unseen).
const maxDemandShapes = 1024

// DemandMix is how often each DemandShape is asked for (the recent pods a
// controller saw, DemandHistory). With it in Policy.Demand, ChooseNode
// ranks nodes first by how much GPU the placement strands: GPU that the
// weighted shapes could no longer use on the node because its CPU or
// memory would be short, too few GPUs would be left, or what is left of a
// GPU is smaller than the shape needs of one (the fragment measure of
// FGD, Weng et al., ATC '23, over the shapes recently asked for).
type DemandMix struct {
	shapes []DemandShape
	counts []int64
	// scarcity multiplies each shape's count (WithScarcity); nil: 1.
	scarcity []int64
	// overdemand is, per GPU product whose pinned pods ask for more than
	// it has left (WithScarcity, overdemanded), what taking from its
	// nodes costs; nil: nothing.
	overdemand map[string]overdemandCost
	// products is each shape's Products split (nil: any product), so
	// that admitting a node's product compares names: splitting the key
	// for every shape of every node scored was a third of the time of a
	// decision on lists that pin a third of their pods.
	products [][]string
}

// NewDemandMix builds a mix from counts per shape (at least one
// positive). Only the maxDemandShapes most frequent shapes are kept.
func NewDemandMix(counts map[DemandShape]int) (*DemandMix, error) {
	keys := slices.SortedFunc(maps.Keys(counts), compareShapes)
	m := &DemandMix{}
	for _, s := range keys {
		if err := s.validate(); err != nil {
			return nil, err
		}
		if c := counts[s]; c < 0 {
			return nil, fmt.Errorf("demand mix: count of %+v must be >= 0, got %d", s, c)
		} else if c > 0 {
			m.shapes = append(m.shapes, s)
			m.counts = append(m.counts, int64(c))
		}
	}
	if len(m.shapes) == 0 {
		return nil, fmt.Errorf("demand mix: no shape has a positive count")
	}
	if len(m.shapes) > maxDemandShapes {
		idx := make([]int, len(m.shapes))
		for i := range idx {
			idx[i] = i
		}
		// Most frequent first; the shape order breaks ties, so the kept
		// shapes do not depend on map order.
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(m.counts[b], m.counts[a]) })
		idx = idx[:maxDemandShapes]
		slices.Sort(idx)
		kept := &DemandMix{}
		for _, i := range idx {
			kept.shapes = append(kept.shapes, m.shapes[i])
			kept.counts = append(kept.counts, m.counts[i])
		}
		m = kept
	}
	m.products = make([][]string, len(m.shapes))
	for i, s := range m.shapes {
		if s.Products != "" {
			m.products[i] = strings.Split(s.Products, "|")
		}
	}
	return m, nil
}

// admitsAt tells whether a node of the given GPU product may run shape i.
func (m *DemandMix) admitsAt(i int, product string) bool {
	ps := m.products[i]
	return ps == nil || slices.Contains(ps, product)
}

func compareShapes(a, b DemandShape) int {
	return cmp.Or(cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(a.ShareMilli, b.ShareMilli),
		cmp.Compare(a.Host.CPUMilli, b.Host.CPUMilli), cmp.Compare(a.Host.MemoryBytes, b.Host.MemoryBytes),
		cmp.Compare(a.Products, b.Products))
}

// MixHoldDistance is how far a new snapshot of a mix (DemandMix, SizeMix)
// may be from the one in use, as the L1 distance between their weights
// each scaled to add up to 1 (0..2), for the one in use to be kept
// (HoldDemand, HoldSize). Every new mix makes every kept node score stale,
// and the next decision of each request shape scores every node again
// (about 100 ms at 5,000 nodes with the stranding ranking): a workload
// whose mix does not move keeps its scores, and 0.1 is a tenth of the
// requests changing shape, which moves a ranking little.
const MixHoldDistance = 0.1

// HoldDemand returns held when next weighs the same shapes within
// MixHoldDistance of it, else next (held nil: next).
func HoldDemand(held, next *DemandMix) *DemandMix {
	if held == nil || next == nil || len(held.shapes) != len(next.shapes) {
		return next
	}
	var sh, sn float64
	for i := range held.shapes {
		if held.shapes[i] != next.shapes[i] {
			return next
		}
		sh += float64(held.weight(i))
		sn += float64(next.weight(i))
	}
	if sh <= 0 || sn <= 0 {
		return next
	}
	var d float64
	for i := range held.shapes {
		d += math.Abs(float64(held.weight(i))/sh - float64(next.weight(i))/sn)
	}
	if d <= MixHoldDistance {
		return held
	}
	return next
}

// weight is shape i's count times its scarcity.
func (m *DemandMix) weight(i int) int64 {
	if m.scarcity == nil {
		return m.counts[i]
	}
	return m.counts[i] * m.scarcity[i]
}

// Shapes lists the weighed shapes with their counts, in a fixed order.
func (m *DemandMix) Shapes() ([]DemandShape, []int64) {
	return slices.Clone(m.shapes), slices.Clone(m.counts)
}

// stranded is the GPU of a node (left: milli GPU unallocated per GPU)
// that the mix's shapes could not use, weighted by their counts: for each
// shape all of the node's unallocated GPU when the shape cannot run there
// (host short, or too few GPUs with what it needs of each), otherwise the
// unallocated rest of the GPUs too small for it and, for a shape pinned
// to products, what the host cannot feed (hostShort). host nil: CPU and memory
// are not known and never short. product is the node's GPU product: a
// shape whose Products exclude it cannot run there (FGD's measure counts
// all of such a node's GPU for it too).
func (m *DemandMix) stranded(left []int32, host *Host, product string) int64 {
	st := [1]strandState{{left: left, host: host}}
	m.strandedOf(st[:], product)
	return st[0].f
}

// strandedPair is stranded of one node in two states, before and after a
// placement, in one pass over the shapes: a ranking scores every node it
// looks at by the difference, and the pass (each shape's weight, its
// products and what it needs of a GPU, read once for both) was most of
// the time of a decision ranked by stranding.
func (m *DemandMix) strandedPair(before, after []int32, hostBefore, hostAfter *Host, product string) (int64, int64) {
	st := [2]strandState{{left: before, host: hostBefore}, {left: after, host: hostAfter}}
	m.strandedOf(st[:], product)
	return st[0].f, st[1].f
}

// strandState is one state of a node that strandedOf measures: its GPU
// left and host, and the sums it keeps while the shapes go by.
type strandState struct {
	left []int32
	host *Host
	// all is the GPU left; f the stranded sum so far.
	all, f int64
	// For the last need per GPU counted: the GPUs that fit it and the
	// GPU left on those that do not (small). Shapes are sorted by GPUs,
	// then share: consecutive shapes mostly need the same of each GPU,
	// and the GPUs that fit it are counted once for all of them.
	lastNeed int32
	fit      int
	small    int64
	// slots is how many of slotsNeed per GPU fit in all, for hostShort:
	// counted only for the shapes pinned to products, when the host is
	// known (the division per GPU was a sixth of the pass on FGD's
	// default list, which pins nothing).
	slotsNeed int32
	slots     int64
}

// strandedOf adds to each state's f what stranded counts for it.
func (m *DemandMix) strandedOf(states []strandState, product string) {
	live := false
	for k := range states {
		st := &states[k]
		st.lastNeed, st.slotsNeed = -1, -1
		for _, l := range st.left {
			st.all += int64(l)
		}
		live = live || st.all > 0
	}
	if !live {
		return
	}
	for i := range m.shapes {
		s := &m.shapes[i]
		w := m.weight(i)
		admits := m.admitsAt(i, product)
		need := s.perGPU()
		for k := range states {
			st := &states[k]
			if st.all == 0 {
				continue
			}
			if !admits || (st.host != nil && !s.Host.fits(*st.host)) {
				st.f += w * st.all
				continue
			}
			if need != st.lastNeed {
				st.lastNeed, st.fit, st.small = need, 0, 0
				for _, l := range st.left {
					if l >= need {
						st.fit++
					} else {
						st.small += int64(l)
					}
				}
			}
			if st.fit < s.GPUs {
				st.f += w * st.all
				continue
			}
			st.f += w * st.small
			if s.Products != "" && st.host != nil {
				if need != st.slotsNeed {
					st.slotsNeed, st.slots = need, 0
					for _, l := range st.left {
						st.slots += int64(l / need)
					}
				}
				st.f += w * hostShort(s, *st.host, st.all-st.small, st.slots)
			}
		}
	}
}

// hostShort is the part of usable (the GPU left on the GPUs that can take
// one of the shape's pods; slots of them, a GPU's worth each) that the
// node's CPU and memory cannot feed: when they hold fewer of the shape's
// pods than its GPUs do, the GPUs beyond them are stranded for the shape
// as surely as a fragment too small. FGD's measure, which the rest of
// stranded is, looks at one pod only and misses them.
//
// Counted for shapes pinned to GPU products only. Their pods have no
// other nodes: GPU models that are scarce and CPU-poor (the trace's V100
// nodes, about 8 cores per GPU) were filled by pinned pods of about 10
// cores per GPU, which left a quarter of those GPUs idle once the cores
// ran out, while pods that may run anywhere and ask for few cores per GPU
// went elsewhere. With the count, those pods are drawn to such nodes
// (they strand none of the GPUs the pinned pods could not have fed
// anyway). For shapes that may run anywhere the count drew single-GPU
// pods onto idle 8-GPU nodes and cost multigpu50 0.44 point of GPU
// unallocated from 100 % arrived (docs/performance/trace.md). Nor is it
// counted when the host is unknown: strandedOf asks only for a pinned
// shape on a node whose host it knows, and counts slots only then.
func hostShort(s *DemandShape, host Host, usable, slots int64) int64 {
	podsGPU := slots / int64(s.GPUs)
	podsHost := podsGPU
	if s.Host.CPUMilli > 0 {
		podsHost = min(podsHost, host.CPUMilli/s.Host.CPUMilli)
	}
	if s.Host.MemoryBytes > 0 {
		podsHost = min(podsHost, host.MemoryBytes/s.Host.MemoryBytes)
	}
	if podsGPU == 0 || podsHost >= podsGPU {
		return 0
	}
	return usable * (podsGPU - podsHost) / podsGPU
}

// Usable tells whether any of the mix's shapes could still run on n as it
// is now (its CPU and memory left, its GPU product, enough GPUs with what
// the shape needs of each): whether n's unallocated GPU is still worth
// keeping for GPU pods. A node without GPUs, or whose GPUs are all
// allocated, is never usable. Host nil: CPU and memory are not known and
// never short. A nil mix knows no shape: then any unallocated GPU counts
// as usable.
func (m *DemandMix) Usable(n *NodeState) bool {
	return m.usable(n, nil)
}

// usable is Usable over the shapes i for which keep(i) holds (every
// shape when keep is nil).
func (m *DemandMix) usable(n *NodeState, keep func(i int) bool) bool {
	if n == nil || n.Topology == nil {
		return false
	}
	var buf [topology.MaxGPUs]int32
	left, all := leftNow(n, buf[:0])
	if all == 0 {
		return false
	}
	if m == nil {
		return true
	}
	product := nodeProduct(n)
	for i := range m.shapes {
		if (keep == nil || keep(i)) && m.runsOn(i, n.Host, left, product) {
			return true
		}
	}
	return false
}
