package controller

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/topology"
)

// GPU states (label state of gpulink_controller_gpus).
const (
	GPUStateAllocated = "allocated"
	GPUStateShared    = "shared"
	GPUStateFree      = "free"
	GPUStateTainted   = "tainted"
)

var (
	gpusDesc = prometheus.NewDesc("gpulink_controller_gpus",
		"GPUs per node, product and state: allocated (given out whole), shared (holds at least one share), "+
			"free (neither, and no NoSchedule/NoExecute device taint besides gpulink's managed one), tainted (neither, but such a taint keeps requests without a toleration away).",
		[]string{"node", "product", "state"}, nil)
	sharesDesc = prometheus.NewDesc("gpulink_controller_shares",
		"Shares of one GPU allocated, per node and product.",
		[]string{"node", "product"}, nil)
	shareMemoryDesc = prometheus.NewDesc("gpulink_controller_share_memory_bytes",
		"GPU memory allocated to shares, per node and product.",
		[]string{"node", "product"}, nil)
	memoryDesc = prometheus.NewDesc("gpulink_controller_gpu_memory_bytes",
		"GPU memory published, per node and product.",
		[]string{"node", "product"}, nil)
	fragmentedDesc = prometheus.NewDesc("gpulink_controller_fragmented_gpus",
		"Per node and set size k (2, 4, 8, ... below the node's GPU count): free GPUs that belong to no set of k free GPUs "+
			"whose every pair is linked at the best class a k-set containing that GPU has on the idle node. "+
			"0 on an idle node; each stranded GPU lost its best k-set to allocations.",
		[]string{"node", "size"}, nil)
)

// inventoryCollector computes the per-node gauges when Prometheus scrapes,
// from the controller's inventory and ledger: the decision path pays
// nothing for them. The work per scrape is one pass over the devices of
// every node; the fragmentation figure is recomputed only for nodes whose
// inventory or set of free GPUs changed since the last scrape, and each
// computation is bounded by fragmentSearchBudget.
type inventoryCollector struct {
	mu     sync.Mutex // serializes scrapes; guards the fields
	inv    *planner.Inventory
	ledger *planner.Ledger
	frag   map[string]*fragEntry // by node name
}

// fragEntry is the last fragmentation figure of a node, valid while the
// node's inventory and free GPUs are the same.
type fragEntry struct {
	node *planner.NodeInventory
	free uint64
	// sizes and stranded are parallel; stranded is -1 where the search
	// ran over its budget.
	sizes    []int
	stranded []int
}

func newInventoryCollector() *inventoryCollector {
	return &inventoryCollector{frag: map[string]*fragEntry{}}
}

// setSource names what the collector reports on; until then (a standby
// replica's registry) it reports nothing.
func (ic *inventoryCollector) setSource(inv *planner.Inventory, l *planner.Ledger) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ic.inv, ic.ledger = inv, l
	clear(ic.frag)
}

func (ic *inventoryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpusDesc, sharesDesc, shareMemoryDesc, memoryDesc, fragmentedDesc} {
		ch <- d
	}
}

// productTotals sums one node's GPUs of one product.
type productTotals struct {
	states             map[string]int
	shares             int
	shareMemory, total int64
}

func (ic *inventoryCollector) Collect(ch chan<- prometheus.Metric) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.inv == nil {
		return
	}
	seen := map[string]bool{}
	for _, n := range ic.inv.All() {
		seen[n.Node] = true
		usage := ic.ledger.NodeUsage(n)
		byProduct := map[string]*productTotals{}
		var free uint64
		for p, d := range n.Devices {
			product := n.Topo.GPUs[p].ProductName
			if product == "" {
				product = "unknown"
			}
			pt := byProduct[product]
			if pt == nil {
				pt = &productTotals{states: map[string]int{}}
				byProduct[product] = pt
			}
			u := usage[p]
			pt.total += n.Topo.GPUs[p].MemoryBytes
			pt.shares += u.Shares
			pt.shareMemory += u.MemoryBytes
			switch {
			case u.Exclusive:
				pt.states[GPUStateAllocated]++
			case u.Shares > 0:
				pt.states[GPUStateShared]++
			case blockingTaint(d):
				pt.states[GPUStateTainted]++
			default:
				pt.states[GPUStateFree]++
				free |= 1 << p
			}
		}
		for product, pt := range byProduct {
			for _, s := range []string{GPUStateAllocated, GPUStateShared, GPUStateFree, GPUStateTainted} {
				ch <- prometheus.MustNewConstMetric(gpusDesc, prometheus.GaugeValue, float64(pt.states[s]), n.Node, product, s)
			}
			ch <- prometheus.MustNewConstMetric(sharesDesc, prometheus.GaugeValue, float64(pt.shares), n.Node, product)
			ch <- prometheus.MustNewConstMetric(shareMemoryDesc, prometheus.GaugeValue, float64(pt.shareMemory), n.Node, product)
			ch <- prometheus.MustNewConstMetric(memoryDesc, prometheus.GaugeValue, float64(pt.total), n.Node, product)
		}
		fe := ic.frag[n.Node]
		if fe == nil || fe.node != n || fe.free != free {
			fe = fragmentation(n, free)
			ic.frag[n.Node] = fe
		}
		for i, k := range fe.sizes {
			if fe.stranded[i] >= 0 {
				ch <- prometheus.MustNewConstMetric(fragmentedDesc, prometheus.GaugeValue, float64(fe.stranded[i]), n.Node, strconv.Itoa(k))
			}
		}
	}
	for node := range ic.frag {
		if !seen[node] {
			delete(ic.frag, node)
		}
	}
}

// fragmentation computes a node's fragmentation figure for every published
// group size.
func fragmentation(n *planner.NodeInventory, free uint64) *fragEntry {
	fe := &fragEntry{node: n, free: free}
	for _, k := range topology.GroupSizes(n.Topo.Len()) {
		stranded, ok := planner.StrandedGPUs(n.Topo, free, k, n.IdleBest(k))
		if !ok {
			stranded = -1
		}
		fe.sizes = append(fe.sizes, k)
		fe.stranded = append(fe.stranded, stranded)
	}
	return fe
}

// blockingTaint tells whether a device carries a NoSchedule or NoExecute
// taint other than gpulink's managed one, which only steers requests to
// the controller.
func blockingTaint(d *planner.DeviceInfo) bool {
	_, ok := planner.UntoleratedTaint(d, nil)
	return ok
}
