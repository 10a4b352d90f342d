package planner

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// Ranking by stranded GPU (Config.RankByStranding, --rank-by-stranding).
//
// FGD's production trace (docs/performance/trace.md) shows where a
// GPU-only node ranking loses: GPUs stay free on nodes whose CPU or memory
// is gone, or in fragments no pod of the recent mix can use. With this on,
// a decision passes the allocator each node's CPU and memory left (its
// allocatable minus what the pods counted on it request, fitTracker), the
// pod's own CPU and memory, and the mix of the shapes of the pods decided
// recently (allocate.DemandHistory), each shape weighed also by how few
// nodes could run it now (allocate.DemandMix.WithScarcity: a shape only a few
// nodes have the CPU and memory for is not stranded on them by small pods
// as cheaply as elsewhere): allocate.ChooseNode then ranks nodes
// by the GPU a placement strands for that mix before link quality and
// packing. It applies where a pod is ranked by allocate.ChooseNode, i.e.
// pods with one device set (quickChoice and choosePlan), the great
// majority; pods with several sets keep podScore's ranking (boundChoice,
// choosePod).

// hostRanking is what a decision ranks with when stranding is on.
type hostRanking struct {
	// left returns a node's CPU and memory left for pods, nil when unknown.
	left func(node string) *allocate.Host
	// pod is what the pod asks for besides its devices.
	pod allocate.Host
}

// key tells score cache entries of this pod's CPU and memory apart.
func (h *hostRanking) key() string {
	if h == nil {
		return ""
	}
	return fmt.Sprintf("\x04host=%d/%d", h.pod.CPUMilli, h.pod.MemoryBytes)
}

// nodeHost returns a node's host left, nil when the ranking is off.
func (h *hostRanking) nodeHost(node string) *allocate.Host {
	if h == nil {
		return nil
	}
	return h.left(node)
}

// request returns the pod's host request (zero when the ranking is off).
func (h *hostRanking) request() allocate.Host {
	if h == nil {
		return allocate.Host{}
	}
	return h.pod
}

// podHost is a pod's CPU (millicores) and memory request as kube-scheduler
// counts them.
func podHost(pod *corev1.Pod) allocate.Host {
	d := podDemand(pod)
	return allocate.Host{CPUMilli: d[corev1.ResourceCPU], MemoryBytes: d[corev1.ResourceMemory]}
}

// demandRecorder keeps the shapes of the pods the controller decided, for
// Policy.Demand. Only decisions touch it, under Controller.decideMu.
type demandRecorder struct {
	hist   *allocate.DemandHistory // nil: stranding ranking off
	logged *allocate.DemandMix
	// weighed is mix, the history's last snapshot, weighed by the
	// scarcity of the nodes that can run each shape: computed once per
	// snapshot, so that kept scores (keyed by the mix) stay valid
	// between snapshots. Nodes added or resized in between count from
	// the next snapshot on.
	mix, weighed *allocate.DemandMix
	// products turns the recorded pods' selectors into the products
	// they admit (products.go); nil in tests that record shapes only.
	products *productAdmission
	// published is weighed, for readers outside the decision lock (the
	// steering taint's writer, reserve.go); changed, when set, is told
	// each time it changes.
	published atomic.Pointer[allocate.DemandMix]
	changed   func()
	// overdemanded is the weighed mix's over-demanded products, as last
	// logged.
	overdemanded []string
}

// demandRefresh is how many decided pods pass between two snapshots of the
// demand mix (allocate.DefaultDemandRefresh; the replay of FGD's trace uses
// the same). Every snapshot invalidates the kept score of every node (a
// score ranks only against scores of the same mix), so the decision after
// it rescores the whole cluster: about 100 ms on 5,000 nodes. Every 256th
// pod keeps those decisions under 1 in 200, and the mix still follows a
// change of workload within half its window. A young history is snapshot
// more often (allocate.DemandHistory): about 55 snapshots over the first
// 2,048 pods instead of 8, once per controller start.
const demandRefresh = allocate.DefaultDemandRefresh

func newDemandRecorder(on bool) (*demandRecorder, error) {
	if !on {
		return &demandRecorder{}, nil
	}
	h, err := allocate.NewDemandHistory(allocate.DefaultHistoryWindow, demandRefresh)
	if err != nil {
		return nil, fmt.Errorf("demand history: %w", err)
	}
	return &demandRecorder{hist: h}, nil
}

// policy returns base with the recent demand mix, each shape weighed by
// how few of the nodes as they are now (nodesNow) could run it
// (unchanged when off; without a mix while no pod was recorded and no
// node's GPU product is known).
func (r *demandRecorder) policy(base allocate.Policy, nodesNow func() []*allocate.NodeState) allocate.Policy {
	if r.hist == nil {
		return base
	}
	if r.hist.Assuming() {
		// Until pods say which GPU products are asked for by name, each
		// product the cluster has counts as asked for (a changed list
		// is a new snapshot, weighed below).
		if err := r.hist.AssumeProducts(r.products.names()); err != nil {
			klog.Background().V(2).Info("Not assuming the cluster's GPU products in the demand mix", "err", err)
		}
	}
	m := r.hist.Mix()
	if m == nil {
		base.Demand = nil
		return base
	}
	if m != r.mix {
		// A new snapshot near the one in use keeps it, and with it every
		// kept node score (allocate.HoldDemand).
		r.mix, r.weighed = m, allocate.HoldDemand(r.weighed, m.WithScarcity(nodesNow()))
		if r.published.Swap(r.weighed) != r.weighed && r.changed != nil {
			r.changed()
		}
		if over := r.weighed.Overdemanded(); !slices.Equal(over, r.overdemanded) {
			// Which products pods that may run elsewhere are kept off
			// changes placements cluster-wide: worth a line when it moves.
			r.overdemanded = over
			klog.Background().V(2).Info("GPU products whose pinned pods ask for more than is left; other pods are placed elsewhere first", "products", over)
		}
	}
	base.Demand = r.weighed
	return base
}

// nodesNow is each GPU node as the scarcity of the demand mix's shapes
// weighs it (allocate.DemandMix.WithScarcity): its GPUs with the ledger's
// usage, those no pod can be given counted as taken (unavailableAsTaken),
// and its CPU and memory left for pods (nil, fitting any pod, when the
// Node informer has not recorded its allocatable yet).
func (f *NodeFilter) nodesNow(nodes []*NodeInventory, usage func(*NodeInventory) []allocate.GPUUsage) []*allocate.NodeState {
	out := make([]*allocate.NodeState, 0, len(nodes))
	for _, n := range nodes {
		if n.Topo == nil || n.Topo.Len() == 0 {
			continue
		}
		out = append(out, &allocate.NodeState{Name: n.Node, Topology: n.Topo, Usage: unavailableAsTaken(n, usage(n)), Host: f.knownHostLeft(n.Node)})
	}
	return out
}

// unavailableAsTaken returns usage (by topology position) with the GPUs of
// n that no pod can be given now (n.unavailable) marked as given out
// whole. Counted as idle, such a GPU is supply for the shapes of its
// product that no pod can use, and the weighing takes those shapes for
// less scarce than they are. usage itself is left as it is (it may be the
// usage cache's); a copy is returned when a GPU is marked.
func unavailableAsTaken(n *NodeInventory, usage []allocate.GPUUsage) []allocate.GPUUsage {
	copied := false
	for _, p := range n.unavailable {
		if p >= len(usage) || usage[p].Exclusive {
			continue
		}
		if !copied {
			usage, copied = slices.Clone(usage), true
		}
		usage[p].Exclusive = true
	}
	return usage
}

// unavailableGPUs lists the positions of the GPUs no pod can be given: a
// GPU whose device is not published whole, or that carries a NoSchedule
// or NoExecute taint (a health taint, a DeviceTaintRule) besides
// gpulink's managed one, which pods without a toleration cannot take.
func unavailableGPUs(devices []*DeviceInfo) []int {
	var out []int
	for p, d := range devices {
		if d == nil {
			out = append(out, p)
			continue
		}
		if _, tainted := UntoleratedTaint(d, nil); tainted {
			out = append(out, p)
		}
	}
	return out
}

// nodesNowOf is nodesNow of nodes with the ledger's usage (through the
// planner's usageCache), for demandRecorder.policy, which reads it only
// when it weighs a new snapshot of the mix.
func (p *Planner) nodesNowOf(nodes []*NodeInventory) func() []*allocate.NodeState {
	return func() []*allocate.NodeState {
		out := p.filter.nodesNow(nodes, p.usage.reader(p.ledger, nodes))
		p.usage.prune(nodes)
		return out
	}
}

// ranking returns the decision's host ranking, nil when off. left gives
// a node's CPU and memory left for pods (nil when unknown).
func (r *demandRecorder) ranking(left func(node string) *allocate.Host, pod *corev1.Pod) *hostRanking {
	if r.hist == nil {
		return nil
	}
	return &hostRanking{left: left, pod: podHost(pod)}
}

// record adds the shape of a decided pod: its largest whole-GPU set, else
// its first share (as the share's dominant fraction of its GPU), with the
// pod's CPU and memory.
func (r *demandRecorder) record(ctx context.Context, pod *corev1.Pod, plan *Plan) {
	if r.hist == nil {
		return
	}
	var shape allocate.DemandShape
	var alt *Alternative
	for _, claim := range plan.Claims {
		for _, res := range claim {
			switch {
			case res.Share == nil && len(res.Positions) > shape.GPUs:
				shape, alt = allocate.DemandShape{GPUs: len(res.Positions)}, res.Alt
			case res.Share != nil && shape.GPUs == 0 && len(res.Positions) == 1:
				total := plan.Node.Topo.GPUs[res.Positions[0]].MemoryBytes
				shape, alt = allocate.DemandShape{GPUs: 1, ShareMilli: shareMilli(*res.Share, total)}, res.Alt
			}
		}
	}
	if shape.GPUs == 0 {
		return
	}
	shape.Host = podHost(pod)
	if alt != nil {
		shape.Products = r.products.of(ctx, alt.Selectors)
	}
	if err := r.hist.Record(shape); err != nil {
		klog.FromContext(ctx).V(2).Info("Not recording the pod's shape in the demand mix", "shape", shape, "err", err)
		return
	}
	if m := r.hist.Mix(); m != r.logged {
		r.logged = m
		klog.FromContext(ctx).V(3).Info("Demand mix refreshed")
	}
}

// shareMilli is the dominant fraction (memory or cores) of a GPU of total
// bytes that a share takes, in thousandths, within 1..999 as DemandShape
// takes it.
func shareMilli(s allocate.ShareRequest, total int64) int {
	m := s.Cores * 10
	if total > 0 {
		m = max(m, (s.MemoryBytes*1000+total-1)/total)
	}
	return int(min(max(m, 1), 999))
}
