package controller

import (
	"context"
	"fmt"
	"sync"

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
// recently (allocate.DemandHistory): allocate.ChooseNode then ranks nodes
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

// hostLeft is a node's allocatable CPU and memory minus what the pods
// counted on it request; nil when the Node or its allocatable CPU or
// memory is unknown (the allocator then never counts it short).
func (f *nodeFilter) hostLeft(name string) *allocate.Host {
	node, err := f.nodes.Get(name)
	if err != nil {
		f.allocatable.forget(name)
		return nil
	}
	alloc, ok := f.allocatable.of(name, node)
	if !ok {
		return nil
	}
	var usedCPU, usedMem int64
	if f.fit != nil {
		f.fit.mu.Lock()
		if u := f.fit.nodes[name]; u != nil {
			usedCPU, usedMem = u.requested[corev1.ResourceCPU], u.requested[corev1.ResourceMemory]
		}
		f.fit.mu.Unlock()
	}
	return &allocate.Host{CPUMilli: max(0, alloc.CPUMilli-usedCPU), MemoryBytes: max(0, alloc.MemoryBytes-usedMem)}
}

// allocatableMemo keeps each Node's allocatable CPU and memory as numbers,
// for the Node object they were read from (the informer replaces the
// object on every change). Ranking by stranding reads them for every node
// on every decision, and reading them from the objects' quantity maps
// took as long as the rest of the decision on 5,000 nodes.
type allocatableMemo struct {
	mu     sync.Mutex
	byNode map[string]allocatableEntry
}

type allocatableEntry struct {
	node *corev1.Node
	host allocate.Host
	ok   bool
}

// of returns the node's allocatable CPU and memory; false when either is
// not published.
func (m *allocatableMemo) of(name string, node *corev1.Node) (allocate.Host, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.byNode[name]; ok && e.node == node {
		return e.host, e.ok
	}
	cpu, okCPU := node.Status.Allocatable[corev1.ResourceCPU]
	mem, okMem := node.Status.Allocatable[corev1.ResourceMemory]
	e := allocatableEntry{node: node, ok: okCPU && okMem}
	if e.ok {
		e.host = allocate.Host{CPUMilli: cpu.MilliValue(), MemoryBytes: mem.Value()}
	}
	if m.byNode == nil {
		m.byNode = map[string]allocatableEntry{}
	}
	m.byNode[name] = e
	return e.host, e.ok
}

// forget drops the entry of a node that is gone.
func (m *allocatableMemo) forget(name string) {
	m.mu.Lock()
	delete(m.byNode, name)
	m.mu.Unlock()
}

// demandRecorder keeps the shapes of the pods the controller decided, for
// Policy.Demand. Only decisions touch it, under Controller.decideMu.
type demandRecorder struct {
	hist   *allocate.DemandHistory // nil: stranding ranking off
	logged *allocate.DemandMix
}

// demandRefresh is how many decided pods pass between two snapshots of the
// demand mix. Every snapshot invalidates the kept score of every node (a
// score ranks only against scores of the same mix), so the decision after
// it rescores the whole cluster: about 100 ms on 5,000 nodes. Every 256th
// pod keeps those decisions under 1 in 200, and the mix still follows a
// change of workload within half its window.
const demandRefresh = allocate.DefaultHistoryWindow / 2

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

// policy returns base with the recent demand mix (unchanged when off, or
// before any pod was recorded).
func (r *demandRecorder) policy(base allocate.Policy) allocate.Policy {
	if r.hist != nil {
		base.Demand = r.hist.Mix()
	}
	return base
}

// ranking returns the decision's host ranking, nil when off.
func (r *demandRecorder) ranking(f *nodeFilter, pod *corev1.Pod) *hostRanking {
	if r.hist == nil {
		return nil
	}
	return &hostRanking{left: f.hostLeft, pod: podHost(pod)}
}

// record adds the shape of a decided pod: its largest whole-GPU set, else
// its first share (as the share's dominant fraction of its GPU), with the
// pod's CPU and memory.
func (r *demandRecorder) record(ctx context.Context, pod *corev1.Pod, plan *nodePlan) {
	if r.hist == nil {
		return
	}
	var shape allocate.DemandShape
	for _, claim := range plan.Claims {
		for _, res := range claim {
			switch {
			case res.Share == nil && len(res.Positions) > shape.GPUs:
				shape = allocate.DemandShape{GPUs: len(res.Positions)}
			case res.Share != nil && shape.GPUs == 0 && len(res.Positions) == 1:
				total := plan.Node.Topo.GPUs[res.Positions[0]].MemoryBytes
				shape = allocate.DemandShape{GPUs: 1, ShareMilli: shareMilli(*res.Share, total)}
			}
		}
	}
	if shape.GPUs == 0 {
		return
	}
	shape.Host = podHost(pod)
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
