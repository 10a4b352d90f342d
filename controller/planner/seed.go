package planner

import (
	"cmp"
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// RunningPod is a pod the cluster already runs with its allocated claims,
// for Planner.Seed.
type RunningPod struct {
	Pod    *corev1.Pod
	Claims []*resourceapi.ResourceClaim
	// Interpreted are the claims as the controller interprets them, in
	// the order of Claims (nil for a claim that is not gpulink's): their
	// selectors give the shape its products (DemandShape.Products). Nil
	// as a whole: the shapes are recorded without products.
	Interpreted []*Claim
}

// RanksByStranding tells whether decisions rank by stranded GPU
// (Config.RankByStranding).
func (p *Planner) RanksByStranding() bool { return p.demand.hist != nil }

// Seed records the shapes of the pods already running in the demand
// history of ranking by stranding, oldest first, as if this controller
// had decided them: a restarted controller then ranks with the mix the
// cluster runs instead of none (without one the ranking falls back to
// GPUs alone until pods arrive, and the first snapshot is of a handful of
// pods). The history's window keeps the newest of them. Pods with no
// gpulink device allocated are skipped. It returns how many pods were
// recorded; with the ranking off it does nothing.
func (p *Planner) Seed(ctx context.Context, pods []RunningPod) int {
	if p.demand.hist == nil {
		return 0
	}
	pods = slices.Clone(pods)
	slices.SortStableFunc(pods, func(a, b RunningPod) int {
		return cmp.Or(a.Pod.CreationTimestamp.Compare(b.Pod.CreationTimestamp.Time), cmp.Compare(a.Pod.Namespace+"/"+a.Pod.Name, b.Pod.Namespace+"/"+b.Pod.Name))
	})
	n := 0
	for _, rp := range pods {
		shape, alt, ok := p.allocatedShape(rp)
		if !ok {
			continue
		}
		shape.Host = podHost(rp.Pod)
		if alt != nil {
			shape.Products = p.demand.products.of(ctx, alt.Selectors)
		}
		if err := p.demand.hist.Record(shape); err != nil {
			klog.FromContext(ctx).V(2).Info("Not seeding the demand mix with the pod's shape", "pod", klog.KObj(rp.Pod), "shape", shape, "err", err)
			continue
		}
		n++
	}
	p.weighDemand()
	return n
}

// allocatedShape is the shape demandRecorder.record gives a decided pod,
// from its claims' allocations: the largest whole-GPU set of one request,
// else the first share (its dominant fraction of the GPU, whose memory
// the inventory knows); with the alternative of the request it came from
// when the pod's interpreted claims are known (nil otherwise).
func (p *Planner) allocatedShape(rp RunningPod) (allocate.DemandShape, *Alternative, bool) {
	maxWhole, share := 0, 0
	var wholeAlt, shareAlt *Alternative
	for ci, c := range rp.Claims {
		if c == nil || c.Status.Allocation == nil {
			continue
		}
		var ic *Claim
		if ci < len(rp.Interpreted) {
			ic = rp.Interpreted[ci]
		}
		whole := map[string]int{}
		for i := range c.Status.Allocation.Devices.Results {
			r := &c.Status.Allocation.Devices.Results[i]
			u, ok := sliceformat.ResultUse(r)
			switch {
			case !ok:
			case u.Exclusive:
				whole[r.Request]++
				if whole[r.Request] > maxWhole {
					maxWhole, wholeAlt = whole[r.Request], ic.alternative(r.Request)
				}
			case share == 0:
				// Pools are named after their nodes.
				if n := p.inv.Node(u.Pool); n != nil && n.Topo != nil {
					if d, ok := n.byName[u.Device]; ok && d.Pos < n.Topo.Len() {
						share = shareMilli(allocate.ShareRequest{MemoryBytes: u.MemoryBytes, Cores: u.Cores}, n.Topo.GPUs[d.Pos].MemoryBytes)
						shareAlt = ic.alternative(r.Request)
					}
				}
			}
		}
	}
	switch {
	case maxWhole > 0:
		return allocate.DemandShape{GPUs: maxWhole}, wholeAlt, true
	case share > 0:
		return allocate.DemandShape{GPUs: 1, ShareMilli: share}, shareAlt, true
	}
	return allocate.DemandShape{}, nil, false
}

// alternative returns the claim's alternative whose results carry the
// request name result ("req" or "req/sub"), nil when none does or the
// claim is nil.
func (ic *Claim) alternative(result string) *Alternative {
	if ic == nil {
		return nil
	}
	for _, r := range ic.Requests {
		for _, a := range r.Alternatives {
			if a.ResultName == result {
				return a
			}
		}
	}
	return nil
}
