// Package report is what gpulink's controller tells users about
// allocations: the per-node view of the GPUs and who holds them (Build),
// which `gpulink inspect` prints and `gpulink explain` reads, built from
// the same slice decoding (internal/sliceformat) and claim accounting the
// controller allocates with, and the reasons of the events the controller
// records (reasons.go). It reads plain API objects and needs no client.
package report

import (
	"cmp"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// Node is a point-in-time view of one node's gpulink GPUs and who
// holds them, built from the same slice decoding and claim accounting the
// controller allocates with, so `gpulink inspect` shows exactly what the
// controller would count. The JSON form is the inspect command's output.
type Node struct {
	// Name is the node the pool's slices name (the pool name when the
	// slices name none).
	Name string `json:"name"`
	// Pool is the ResourceSlice pool; the kubelet plugin names it after
	// the node.
	Pool string `json:"pool"`
	// Topology is the node's decoded topology; nil when Problem is set or
	// the node has no GPUs.
	Topology *topology.Topology `json:"-"`
	// GPUs are the node's devices in ascending GPU index.
	GPUs []GPU `json:"gpus"`
	// MIG are the MIG devices of the node's GPUs in MIG mode, by parent
	// GPU index then placement: the GPUs' MIG layout.
	MIG []MIG `json:"mig,omitempty"`
	// OnDemand are the node's GPUs partitioned on demand (MIG on demand)
	// by index: the partitions held and what still fits (ondemand.go).
	OnDemand []OnDemandGPU `json:"onDemand,omitempty"`
	// Problem says why the pool could not be decoded (incomplete
	// generation, conflicting indices, bad links rows, ...); the
	// controller allocates nothing on such a node.
	Problem string `json:"problem,omitempty"`
	// UnknownDevices are allocations naming devices of this pool that its
	// slices do not publish, or that could not be decoded because of
	// Problem: a GPU that disappeared while a claim still holds it.
	UnknownDevices []DeviceHold `json:"unknownDevices,omitempty"`
}

// GPU is one GPU, its holders and what is left of it.
type GPU struct {
	// Device is the ResourceSlice device name, gpu-<Index>.
	Device  string `json:"device"`
	Index   int    `json:"index"`
	Product string `json:"product,omitempty"`
	// MemoryBytes and Cores are the published capacities.
	MemoryBytes int64 `json:"memoryBytes"`
	Cores       int64 `json:"cores"`
	// Whole lists the claims holding the GPU exclusively; more than one is
	// a double allocation and is named in Problems.
	Whole  []ClaimRef    `json:"whole,omitempty"`
	Shares []ShareHolder `json:"shares,omitempty"`
	// Free tells whether the GPU can still be given out whole.
	Free bool `json:"free"`
	// FreeMemoryBytes and FreeCores are what shares may still take; zero
	// while the GPU is held whole. Never negative: an over-committed GPU
	// shows zero and a Problems entry.
	FreeMemoryBytes int64 `json:"freeMemoryBytes"`
	FreeCores       int64 `json:"freeCores"`
	// Taints are the device's taints other than the managed-by-controller
	// taint every device carries, as key=value:Effect.
	Taints []string `json:"taints,omitempty"`
	// Tainted: one of Taints has effect NoSchedule or NoExecute (e.g.
	// gpu.gpulink.dev/unhealthy), so nothing new is given out on the GPU:
	// it is not Free and has no free share capacity.
	Tainted bool `json:"tainted,omitempty"`
	// Problems are accounting inconsistencies: double whole allocations,
	// whole plus shares, shares beyond the capacity.
	Problems []string `json:"problems,omitempty"`
}

// MIG is one MIG device (an instance of a GPU in MIG mode) and who
// holds it. A MIG device is given out whole, to one claim.
type MIG struct {
	// Device is the ResourceSlice device name, gpu-<parent>-mig-<gi>-<ci>.
	Device string `json:"device"`
	// Parent is the index of the GPU the device is part of.
	Parent  int    `json:"parentIndex"`
	Profile string `json:"profile"`
	// PlacementStart and PlacementSize are the memory slices of the GPU
	// the device's GPU instance takes.
	PlacementStart int   `json:"placementStart"`
	PlacementSize  int   `json:"placementSize"`
	MemoryBytes    int64 `json:"memoryBytes"`
	// Holders are the claims holding the device; more than one, or a
	// share of it, is named in Problems.
	Holders []ClaimRef `json:"holders,omitempty"`
	// Free tells whether the device can still be given out.
	Free    bool     `json:"free"`
	Taints  []string `json:"taints,omitempty"`
	Tainted bool     `json:"tainted,omitempty"`
	// Problems are accounting inconsistencies.
	Problems []string `json:"problems,omitempty"`
}

// ClaimRef names a claim and the consumers it is reserved for.
type ClaimRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// ReservedFor lists status.reservedFor as resource/name ("pods/x";
	// other resources with their API group, "jobs.batch/y").
	ReservedFor []string `json:"reservedFor,omitempty"`
}

// String is namespace/name.
func (c ClaimRef) String() string { return c.Namespace + "/" + c.Name }

// ShareHolder is one share of a GPU.
type ShareHolder struct {
	Claim       ClaimRef `json:"claim"`
	ShareID     string   `json:"shareID"`
	MemoryBytes int64    `json:"memoryBytes"`
	Cores       int64    `json:"cores"`
}

// DeviceHold is an allocation of a device the report cannot place on a GPU.
type DeviceHold struct {
	Device string   `json:"device"`
	Claim  ClaimRef `json:"claim"`
	// Share is false for a whole-device (dedicated) result.
	Share       bool  `json:"share"`
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	Cores       int64 `json:"cores,omitempty"`
}

// Build decodes gpulink's ResourceSlices into per-node reports and
// attributes every gpulink allocation result of the claims to its GPU.
// Slices of other drivers and claims without gpulink results are ignored.
// Reports are sorted by node then pool name. A pool whose slices do not
// decode gets a report with Problem set rather than failing the whole
// report; a pool without slices that claims still allocate from gets one
// too, so no allocation goes unshown.
func Build(published []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim) []Node {
	pools := map[string][]*resourceapi.ResourceSlice{}
	for _, s := range published {
		if s == nil || s.Spec.Driver != driver.Name {
			continue
		}
		pools[s.Spec.Pool.Name] = append(pools[s.Spec.Pool.Name], s)
	}
	holds := poolHolds(claims)
	for pool := range holds {
		if _, ok := pools[pool]; !ok {
			pools[pool] = nil
		}
	}

	reports := make([]Node, 0, len(pools))
	for pool, ps := range pools {
		reports = append(reports, poolReport(pool, ps, holds[pool]))
	}
	slices.SortFunc(reports, func(a, b Node) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Pool, b.Pool))
	})
	return reports
}

// hold is one gpulink allocation result and the claim it belongs to.
type hold struct {
	use     sliceformat.Use
	claim   ClaimRef
	shareID string
}

// poolHolds groups the gpulink allocation results of all claims by pool.
func poolHolds(claims []*resourceapi.ResourceClaim) map[string][]hold {
	out := map[string][]hold{}
	for _, c := range claims {
		if c == nil || c.Status.Allocation == nil {
			continue
		}
		ref := claimRef(c)
		for i := range c.Status.Allocation.Devices.Results {
			r := &c.Status.Allocation.Devices.Results[i]
			u, ok := sliceformat.ResultUse(r)
			if !ok {
				continue
			}
			h := hold{use: u, claim: ref}
			if r.ShareID != nil {
				h.shareID = string(*r.ShareID)
			}
			out[u.Pool] = append(out[u.Pool], h)
		}
	}
	return out
}

func claimRef(c *resourceapi.ResourceClaim) ClaimRef {
	ref := ClaimRef{Namespace: c.Namespace, Name: c.Name}
	for _, r := range c.Status.ReservedFor {
		res := r.Resource
		if r.APIGroup != "" {
			res += "." + r.APIGroup
		}
		ref.ReservedFor = append(ref.ReservedFor, res+"/"+r.Name)
	}
	return ref
}

// poolReport builds the report of one pool from its slices (possibly none)
// and the allocations naming it.
func poolReport(pool string, ps []*resourceapi.ResourceSlice, holds []hold) Node {
	r := Node{Name: nodeNameOf(pool, ps), Pool: pool, GPUs: []GPU{}}
	switch {
	case len(ps) == 0:
		r.Problem = fmt.Sprintf("pool %q publishes no ResourceSlices, yet claims hold its devices", pool)
	case !hasDevices(ps):
		// The plugin publishes an empty pool on a node without GPUs;
		// that is a state, not a problem.
	default:
		n, err := sliceformat.DecodePool(pool, ps)
		if err != nil {
			r.Problem = err.Error()
			break
		}
		r.Name = n.Node
		r.Topology = n.Topology
		for _, g := range n.GPUs {
			r.GPUs = append(r.GPUs, gpuReport(n, g))
		}
		for _, m := range n.MIG {
			r.MIG = append(r.MIG, migReport(m))
		}
		slices.SortFunc(r.MIG, func(a, b MIG) int {
			return cmp.Or(cmp.Compare(a.Parent, b.Parent), cmp.Compare(a.PlacementStart, b.PlacementStart), cmp.Compare(a.Device, b.Device))
		})
		if r.OnDemand, err = onDemandReports(n); err != nil {
			r.Problem = err.Error()
		}
	}
	byDevice := make(map[string]*GPU, len(r.GPUs))
	for i := range r.GPUs {
		byDevice[r.GPUs[i].Device] = &r.GPUs[i]
	}
	byMIG := make(map[string]*MIG, len(r.MIG))
	for i := range r.MIG {
		byMIG[r.MIG[i].Device] = &r.MIG[i]
	}
	for i := range r.OnDemand {
		for j := range r.OnDemand[i].all {
			byMIG[r.OnDemand[i].all[j].Device] = &r.OnDemand[i].all[j]
		}
	}
	for _, h := range holds {
		g := byDevice[h.use.Device]
		m := byMIG[h.use.Device]
		switch {
		case m != nil && h.use.Exclusive:
			m.Holders = append(m.Holders, h.claim)
		case m != nil:
			m.Problems = append(m.Problems, fmt.Sprintf("shared with claim %s (share %s); a MIG device is given out whole", h.claim, h.shareID))
		case g == nil:
			r.UnknownDevices = append(r.UnknownDevices, DeviceHold{
				Device: h.use.Device, Claim: h.claim, Share: !h.use.Exclusive,
				MemoryBytes: h.use.MemoryBytes, Cores: h.use.Cores,
			})
		case h.use.Exclusive:
			g.Whole = append(g.Whole, h.claim)
		default:
			g.Shares = append(g.Shares, ShareHolder{Claim: h.claim, ShareID: h.shareID, MemoryBytes: h.use.MemoryBytes, Cores: h.use.Cores})
		}
	}
	for i := range r.GPUs {
		settle(&r.GPUs[i])
	}
	for i := range r.MIG {
		m := &r.MIG[i]
		slices.SortFunc(m.Holders, compareClaims)
		if len(m.Holders) > 1 {
			m.Problems = append(m.Problems, fmt.Sprintf("held by %d claims", len(m.Holders)))
		}
		m.Free = len(m.Holders) == 0 && len(m.Problems) == 0 && !m.Tainted
	}
	for i := range r.OnDemand {
		settleOnDemand(&r.OnDemand[i])
	}
	slices.SortFunc(r.UnknownDevices, func(a, b DeviceHold) int {
		return cmp.Or(compareDevices(a.Device, b.Device), compareClaims(a.Claim, b.Claim))
	})
	return r
}

// nodeNameOf names the node of a pool that may not decode: the first
// slice (by name) that names a node, else the pool itself.
func nodeNameOf(pool string, ps []*resourceapi.ResourceSlice) string {
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, func(a, b *resourceapi.ResourceSlice) int { return cmp.Compare(a.Name, b.Name) })
	for _, s := range sorted {
		if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			return *s.Spec.NodeName
		}
	}
	return pool
}

func hasDevices(ps []*resourceapi.ResourceSlice) bool {
	for _, s := range ps {
		if len(s.Spec.Devices) > 0 {
			return true
		}
	}
	return false
}

// gpuReport is one GPU before its holders are counted.
func gpuReport(n *sliceformat.Pool, g sliceformat.GPU) GPU {
	t := n.Topology.GPUs[g.Pos]
	r := GPU{
		Device:      g.Device.Name,
		Index:       g.Index,
		Product:     t.ProductName,
		MemoryBytes: t.MemoryBytes,
	}
	if c, ok := sliceformat.Capacity(g.Device, driver.CapacityCores); ok {
		r.Cores = c.Value.Value()
	}
	r.Taints, r.Tainted = taints(g.Device.Taints)
	return r
}

// migReport is one MIG device before its holders are counted.
func migReport(m sliceformat.MIGDevice) MIG {
	r := MIG{Device: m.Device.Name, Parent: m.Parent, Profile: m.Profile,
		PlacementStart: m.Placement.Start, PlacementSize: m.Placement.Size, MemoryBytes: m.MemoryBytes}
	r.Taints, r.Tainted = taints(m.Device.Taints)
	return r
}

// taints renders a device's taints but gpulink's managed one, and tells
// whether any keeps work off the device (NoSchedule, NoExecute) as the
// controller counts it.
func taints(ts []resourceapi.DeviceTaint) ([]string, bool) {
	var out []string
	for _, t := range ts {
		if t.Key == driver.ManagedTaintKey {
			continue
		}
		out = append(out, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
	}
	return out, len(sliceformat.SchedulingTaints(ts)) > 0
}

// settle sorts a GPU's holders and derives its free capacity and problems,
// counting the way the ledger does: any whole holder takes the device, and
// shares add up their consumed capacity.
func settle(g *GPU) {
	slices.SortFunc(g.Whole, compareClaims)
	slices.SortFunc(g.Shares, func(a, b ShareHolder) int {
		return cmp.Or(compareClaims(a.Claim, b.Claim), cmp.Compare(a.ShareID, b.ShareID))
	})
	var mem, cores int64
	for _, s := range g.Shares {
		mem += s.MemoryBytes
		cores += s.Cores
	}
	if len(g.Whole) > 1 {
		g.Problems = append(g.Problems, fmt.Sprintf("held whole by %d claims", len(g.Whole)))
	}
	if len(g.Whole) > 0 && len(g.Shares) > 0 {
		g.Problems = append(g.Problems, fmt.Sprintf("held whole and shared at the same time (%d shares)", len(g.Shares)))
	}
	if mem > g.MemoryBytes {
		g.Problems = append(g.Problems, fmt.Sprintf("shares take %d bytes of memory, the GPU has %d", mem, g.MemoryBytes))
	}
	if cores > g.Cores {
		g.Problems = append(g.Problems, fmt.Sprintf("shares take %d cores, the GPU has %d", cores, g.Cores))
	}
	g.Free = len(g.Whole) == 0 && len(g.Shares) == 0 && !g.Tainted
	if len(g.Whole) == 0 && !g.Tainted {
		g.FreeMemoryBytes = max(g.MemoryBytes-mem, 0)
		g.FreeCores = max(g.Cores-cores, 0)
	}
}

func compareClaims(a, b ClaimRef) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// compareDevices orders gpu-<index> names numerically (gpu-2 before
// gpu-10) and anything else after them, by name.
func compareDevices(a, b string) int {
	ia, errA := driver.ParseDeviceName(a)
	ib, errB := driver.ParseDeviceName(b)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(ia, ib)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return cmp.Compare(a, b)
}
