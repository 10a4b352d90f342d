package allocate

import "slices"

// Products whose pinned pods ask for more than they have.
//
// FGD's measure sees no cost in a pod taking a GPU that pinned pods will
// need: a GPU given out is no longer unallocated, so it is stranded for
// no shape. WithScarcity makes up for it only indirectly: the GPU of
// other products counts as stranded for the shapes pinned to a scarce
// one, so that taking it elsewhere earns their weight. A pod that may run
// anywhere then weighs that against how well it packs, and on the FGD
// artifact's own list with GPU-model constraints (gpuspec33: a sixth of
// the GPU demand pinned to T4, which has 14 % of the GPUs) shares that
// may run anywhere packed best onto the T4 GPUs that T4 shares had
// started. About 42 T4 GPUs went to such pods by 70 % arrived, and from
// 80 % the T4 pods found none left: 1.46 % of the GPU unallocated at 80
// % arrived against first fit's 0.73 % (3 seeds; first fit fills the
// nodes in list order, and the T4 nodes come late).
//
// When the pods pinned to a product ask for a larger share of what is
// asked than the product's share of what is left, every GPU of it that
// they could be fed on will be wanted by a pod that can run nowhere
// else, and a placement that takes one is a GPU lost as surely as one
// stranded for every shape. So strandChange counts it so: what the
// placement takes of the GPU the product's pinned pods could still be fed
// on, times the weight of the whole mix. What they could be fed on is the
// node's GPU left, but no more than its CPU and memory left can feed at
// the pinned pods' mean CPU and memory per GPU: on the CPU-poor V100
// nodes of FGD's trace, whose pinned pods ask for more cores per GPU than
// the nodes have, the GPU beyond what the cores feed costs nothing, and
// the pods that ask for few cores still fill it (counting every GPU cost
// the lists that pin a third of their pods to models drawn uniformly up
// to 0.3 point of the GPU from 110 % arrived; docs/performance/trace.md).
// Pods pinned to that product alone pay it on every node they could
// take, and mostly in proportion to the GPU they take.

// overdemandScale splits a shape's demand evenly among the products it
// admits in integers: it is divisible by every count up to 8.
const overdemandScale = 840

// overdemandCost is what a placement on a node of an over-demanded
// product costs.
type overdemandCost struct {
	// weight is the cost of one milli GPU the product's pinned pods can
	// no longer be fed on: the mix's total weight.
	weight int64
	// cpuPerMilli and memoryPerMilli are the CPU (milli) and memory
	// (bytes) the product's pinned pods ask for per milli GPU, on average
	// over their demand (0: not asked for).
	cpuPerMilli, memoryPerMilli float64
}

// feedable is the milli GPU of a node with left (per GPU) and host (nil:
// any CPU and memory) that the product's pinned pods could be fed on:
// the GPU left, but no more than the host's CPU and memory feed at the
// pods' mean need per milli GPU.
func (c overdemandCost) feedable(left []int32, host *Host) float64 {
	var g float64
	for _, l := range left {
		g += float64(l)
	}
	if host == nil {
		return g
	}
	if c.cpuPerMilli > 0 {
		g = min(g, float64(max(host.CPUMilli, 0))/c.cpuPerMilli)
	}
	if c.memoryPerMilli > 0 {
		g = min(g, float64(max(host.MemoryBytes, 0))/c.memoryPerMilli)
	}
	return g
}

// overdemanded returns, for each GPU product whose pinned demand outruns
// its supply, what taking from its nodes costs; nil when none does.
// supply is each product's unallocated milli GPU now and all their sum.
// A shape's demand is its count times its GPUs times what it needs of
// each; a shape pinned to several products counts evenly for each of
// them that has GPU left. A product is over-demanded when the pinned
// demand for it is a larger share of the mix's demand than its supply is
// of all. Each product's sums run over the shapes in the mix's order, so
// the result does not depend on the order of the products.
func (m *DemandMix) overdemanded(supply *productSupply, all int64) map[string]overdemandCost {
	products := supply.names
	if all <= 0 || len(products) == 0 {
		return nil
	}
	pinned := make([]int64, len(products))
	cpu := make([]float64, len(products))
	memory := make([]float64, len(products))
	var total, weight int64
	// admits is the products a shape admits, by index: found once per
	// shape, then its demand is split evenly among them.
	admits := make([]int, 0, len(products))
	for i, s := range m.shapes {
		weight += m.weight(i)
		d := m.counts[i] * int64(s.GPUs) * int64(s.perGPU()) * overdemandScale
		total += d
		if s.Products == "" {
			continue
		}
		admits = admits[:0]
		for j, p := range products {
			if m.admitsAt(i, p) {
				admits = append(admits, j)
			}
		}
		admitted := len(admits)
		for _, j := range admits {
			pinned[j] += d / int64(admitted)
			cpu[j] += float64(m.counts[i]) * float64(s.Host.CPUMilli) / float64(admitted)
			memory[j] += float64(m.counts[i]) * float64(s.Host.MemoryBytes) / float64(admitted)
		}
	}
	var out map[string]overdemandCost
	for j, p := range products {
		// pinned/total > supply/all, in floats: both products may pass
		// 2^63 on a large cluster; the operands are exact integers.
		if pinned[j] == 0 || float64(pinned[j])*float64(all) <= float64(total)*float64(supply.sums[j]) {
			continue
		}
		if out == nil {
			out = make(map[string]overdemandCost)
		}
		milli := float64(pinned[j]) / overdemandScale
		out[p] = overdemandCost{weight: weight, cpuPerMilli: cpu[j] / milli, memoryPerMilli: memory[j] / milli}
	}
	return out
}

// strandChange is how much more GPU the mix strands on a node of product
// once a placement leaves its GPUs with after instead of before (and its
// host with hostAfter instead of hostBefore), as stranded counts it, plus
// what the placement costs the pinned pods of an over-demanded product.
func (m *DemandMix) strandChange(before, after []int32, hostBefore, hostAfter *Host, product string) int64 {
	b, a := m.strandedPair(before, after, hostBefore, hostAfter, product)
	d := a - b
	if c, ok := m.overdemand[product]; ok {
		if lost := c.feedable(before, hostBefore) - c.feedable(after, hostAfter); lost > 0 {
			d += int64(float64(c.weight) * lost)
		}
	}
	return d
}

// Overdemanded lists the GPU products the mix counts as over-demanded, in
// order: those whose pinned pods ask for a larger share of the demand
// than their share of the unallocated GPU when WithScarcity weighed it.
func (m *DemandMix) Overdemanded() []string {
	if m == nil {
		return nil
	}
	out := make([]string, 0, len(m.overdemand))
	for p := range m.overdemand {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
