package allocate

import (
	"cmp"
	"slices"

	"github.com/gpulink/gpulink/driver/topology"
)

// scarcityScale is what WithScarcity multiplies every weight by, so that
// the ratios of supplies keep a fraction (an integer ratio would weigh a
// shape with 1.4 times less supply than all like one with as much).
const scarcityScale = 16

// WithScarcity returns the mix with each shape weighed also by how scarce
// the GPU is that could serve it now: a shape that only some nodes could
// run as they are (enough GPUs with enough left of each, CPU and memory
// left, a product it admits, as Usable counts it) counts as many times
// more as the unallocated GPU of all nodes is larger than the unallocated
// GPU of those nodes (times scarcityScale, at least scarcityScale). FGD's
// measure weighs a node's stranded GPU by how often each shape is asked
// for, as if every node could serve every shape, and that fails twice on
// FGD's trace:
//
//   - a few 8-GPU pods ask for 120 of a node's 128 cores, which 39 of the
//     1,213 nodes have, and a pod of 8 cores placed on one of those strands
//     them as cheaply as on any other node: by 90 % arrived, such pods
//     found no node;
//   - pods pinned to a GPU product (Products) need the nodes of that
//     product, and pods that may run anywhere took the small T4 and P100
//     nodes first (they pack best), so that the pinned pods found none
//     left while a third of the G2 nodes stood idle. Each GPU a placement
//     takes from a product costs the pinned shapes of that product (the
//     node's GPU is no longer all stranded for the shapes it cannot run,
//     FGD's measure), and with their weight grown as the product's
//     unallocated GPU shrinks, the pods that may run anywhere go where
//     the GPU is least wanted.
//
// The supply is what could run the shape now, not what could if its
// nodes were idle: a shape no node could run any more keeps the least
// weight (it strands the same GPU everywhere). Counted on idle capacity,
// the fragments of a full cluster still counted as the supply of the
// large or pinned shapes they can no longer hold, those shapes kept
// their weight, and the last small pods filled the fragments by a
// measure of shapes that could not be placed anyway: about 0.1 point of
// the GPU more unallocated than FGD from 110 % arrived on lists with
// GPU-model constraints (docs/performance/trace.md). Nodes without GPUs
// are skipped; a node whose Host is nil fits any CPU and memory. The
// result also knows the products whose pinned pods ask for more than
// they have left (overdemand.go). It shares m's shapes; m is unchanged.
func (m *DemandMix) WithScarcity(nodes []*NodeState) *DemandMix {
	out := &DemandMix{shapes: m.shapes, counts: m.counts, products: m.products, scarcity: make([]int64, len(m.shapes))}
	capable := make([]int64, len(m.shapes))
	var supply productSupply
	var all int64
	var buf [topology.MaxGPUs]int32
	for _, n := range nodes {
		if n == nil || n.Topology == nil || n.Topology.Len() == 0 {
			continue
		}
		gpus, left := leftNow(n, buf[:0])
		if left == 0 {
			continue
		}
		all += left
		product := nodeProduct(n)
		supply.add(product, left)
		for i := range m.shapes {
			if m.runsOn(i, n.Host, gpus, product) {
				capable[i] += left
			}
		}
	}
	for i := range m.shapes {
		out.scarcity[i] = scarcityScale
		if capable[i] > 0 {
			out.scarcity[i] = max(scarcityScale, all*scarcityScale/capable[i])
		}
	}
	out.overdemand = out.overdemanded(&supply, all)
	return out
}

// runsOn tells whether a pod of shape i could be placed on a node now:
// its CPU and memory fit what the node has left (host; any when nil), its
// product is admitted, and s.GPUs GPUs have what one of its GPUs needs
// left (left: leftNow's, largest first, so that the s.GPUs-th largest
// decides without a pass over the node's GPUs for every shape:
// WithScarcity checks every shape of the mix on every node).
func (m *DemandMix) runsOn(i int, host *Host, left []int32, product string) bool {
	s := &m.shapes[i]
	if s.GPUs > len(left) || left[s.GPUs-1] < s.perGPU() {
		return false
	}
	return (host == nil || s.Host.fits(*host)) && m.admitsAt(i, product)
}

// leftNow is what each of n's GPUs has left (gpuLeft, into buf), largest
// first as runsOn reads it, and their sum.
func leftNow(n *NodeState, buf []int32) (left []int32, sum int64) {
	left = gpuLeft(n, buf)
	slices.SortFunc(left, func(a, b int32) int { return cmp.Compare(b, a) })
	for _, l := range left {
		sum += int64(l)
	}
	return left, sum
}

// productSupply sums the unallocated GPU per GPU product. A cluster has
// few products, and its nodes mostly come in runs of one: the last
// product is checked first, then a short list. A map update per node
// made WithScarcity 7-19 % slower than before the per-product sums on
// 5,000 nodes of four products (BenchmarkWithScarcity5000Nodes); this,
// 3-5 %.
type productSupply struct {
	names []string
	sums  []int64
	last  int
}

func (p *productSupply) add(product string, left int64) {
	if p.last < len(p.names) && p.names[p.last] == product {
		p.sums[p.last] += left
		return
	}
	for i, n := range p.names {
		if n == product {
			p.last = i
			p.sums[i] += left
			return
		}
	}
	p.last = len(p.names)
	p.names = append(p.names, product)
	p.sums = append(p.sums, left)
}
