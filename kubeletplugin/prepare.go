package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// claimError is a per-claim failure; its message names the claim and the
// offending field.
func claimError(ns, name string, uid types.UID, err error) error {
	return fmt.Errorf("claim %s/%s (UID %s): %w", ns, name, uid, err)
}

// PrepareResourceClaims implements draplugin.DRAPlugin. Each claim is
// prepared at most once: a claim already in the checkpoint is answered from
// it. Side effects happen only after the claim is recorded as
// PrepareStarted, and a failure rolls them back, so a bad claim leaves
// neither a CDI spec nor a checkpoint entry behind.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]draplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	// The checkpoint as every instance of the plugin left it (rolling.go).
	unlock, err := d.lockState(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()

	start := d.clock.Now()
	results := make(map[types.UID]draplugin.PrepareResult, len(claims))
	fail := func(uid types.UID, err error) {
		results[uid] = draplugin.PrepareResult{Err: err}
		d.metrics.ClaimErrors.WithLabelValues(opPrepare).Inc()
		logger.Error(err, "Preparing claim failed")
	}

	var work []*PreparedClaim
	for _, claim := range claims {
		if pc := d.cp.Claims[claim.UID]; pc != nil {
			if pc.State == PrepareCompleted {
				logger.V(3).Info("Claim already prepared", "claim", klog.KObj(claim))
				if pc.notePods(claim) {
					d.dirty = true
				}
				results[claim.UID] = draplugin.PrepareResult{Devices: pc.kubeletDevices(d.baseID)}
				continue
			}
			// PrepareStarted: planned earlier in this call (the claim is
			// listed twice) and answered with it. Interrupted calls left
			// none behind: recovery rolled them back at startup, and every
			// error path of this call removes its claims.
			continue
		}
		pc, err := d.planClaim(logger, claim)
		if err != nil {
			fail(claim.UID, claimError(claim.Namespace, claim.Name, claim.UID, err))
			continue
		}
		pc.State = PrepareStarted
		pc.Pods = claimPods(claim)
		d.cp.Claims[claim.UID] = pc
		work = append(work, pc)
	}
	if len(work) > 0 {
		planned := map[string]*PreparedClaim{}
		for _, claim := range claims {
			if pc := d.cp.Claims[claim.UID]; pc != nil {
				planned[claim.Namespace+"/"+claim.Name] = pc
			}
		}
		joinContainerGroups(logger, claims, planned)
	}
	if len(work) == 0 {
		d.flushIfDirty(logger)
		d.observe(opPrepare, start, len(claims))
		return results, nil
	}

	// Record the intent before touching anything outside the process.
	if err := d.store(); err != nil {
		for _, pc := range work {
			delete(d.cp.Claims, pc.UID)
			fail(pc.UID, claimError(pc.Namespace, pc.Name, pc.UID, fmt.Errorf("recording PrepareStarted: %w", err)))
		}
		d.observe(opPrepare, start, len(claims))
		return results, nil
	}

	var done []*PreparedClaim
	for _, pc := range work {
		if err := d.apply(ctx, pc); err != nil {
			delete(d.cp.Claims, pc.UID)
			d.dirty = true
			fail(pc.UID, claimError(pc.Namespace, pc.Name, pc.UID, err))
			continue
		}
		pc.State = PrepareCompleted
		done = append(done, pc)
	}
	if err := d.store(); err != nil {
		// Without a durable PrepareCompleted a restart would roll the
		// claims back under running containers: fail them now instead.
		for _, pc := range done {
			claimErr := fmt.Errorf("recording PrepareCompleted: %w", err)
			if terr := d.teardown(ctx, pc); terr != nil {
				// A spec left behind is removed as stray at the next start.
				claimErr = errors.Join(claimErr, fmt.Errorf("rolling back: %w", terr))
			}
			delete(d.cp.Claims, pc.UID)
			fail(pc.UID, claimError(pc.Namespace, pc.Name, pc.UID, claimErr))
		}
		d.dirty = true
		d.observe(opPrepare, start, len(claims))
		return results, nil
	}
	for _, pc := range done {
		results[pc.UID] = draplugin.PrepareResult{Devices: pc.kubeletDevices(d.baseID)}
		logger.V(2).Info("Prepared claim", "claim", klog.KRef(pc.Namespace, pc.Name), "uid", pc.UID, "devices", len(pc.Devices), "cdiDevice", pc.CDIDeviceID)
	}
	d.observe(opPrepare, start, len(claims))
	return results, nil
}

// UnprepareResourceClaims implements draplugin.DRAPlugin. Claims that
// are not prepared succeed (after removing a stray CDI spec, if any).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []draplugin.NamespacedObject) (map[types.UID]error, error) {
	logger := klog.FromContext(ctx)
	unlock, err := d.lockState(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()

	start := d.clock.Now()
	results := make(map[types.UID]error, len(claims))
	var removed []draplugin.NamespacedObject
	for _, c := range claims {
		pc := d.cp.Claims[c.UID]
		if pc == nil {
			if err := d.cdi.RemoveClaimSpec(c.UID); err != nil {
				results[c.UID] = claimError(c.Namespace, c.Name, c.UID, err)
				continue
			}
			results[c.UID] = nil
			continue
		}
		if err := d.teardown(ctx, pc); err != nil {
			// Keep the entry (with the references already released
			// cleared) so that the kubelet's retry finishes the job.
			d.dirty = true
			results[c.UID] = claimError(c.Namespace, c.Name, c.UID, fmt.Errorf("unprepare: %w", err))
			continue
		}
		delete(d.cp.Claims, c.UID)
		d.dirty = true
		removed = append(removed, c)
		results[c.UID] = nil
	}
	if d.dirty {
		if err := d.store(); err != nil {
			for _, c := range claims {
				if results[c.UID] == nil {
					results[c.UID] = claimError(c.Namespace, c.Name, c.UID, fmt.Errorf("writing checkpoint: %w", err))
				}
			}
		}
	}
	for _, c := range claims {
		if results[c.UID] != nil {
			d.metrics.ClaimErrors.WithLabelValues(opUnprepare).Inc()
			logger.Error(results[c.UID], "Unpreparing claim failed")
		}
	}
	for _, c := range removed {
		if results[c.UID] == nil {
			logger.V(2).Info("Unprepared claim", "claim", klog.KRef(c.Namespace, c.Name), "uid", c.UID)
		}
	}
	d.observe(opUnprepare, start, len(claims))
	return results, nil
}

// observe records the duration of one call, spread evenly over its claims.
func (d *Driver) observe(op string, start time.Time, n int) {
	if n == 0 {
		return
	}
	per := d.clock.Since(start).Seconds() / float64(n)
	h := d.metrics.ClaimDuration.WithLabelValues(op)
	for range n {
		h.Observe(per)
	}
}

// kubeletDevices is what the kubelet gets for a prepared claim: for each
// result its GPU's own CDI device, then baseID when not empty (the node's
// base CDI device: driver files and hooks), then the claim's device, then
// its request's view where the claim has views (cdiviews.go). The
// kubelet names a device in a pod's allocatedResourcesStatus by its first
// CDI device ID, so each GPU reports its own health; the shares of one GPU
// name the same device, which the kubelet lists once. Claims recorded by
// a version without per-GPU devices get their old IDs (base, claim).
func (pc *PreparedClaim) kubeletDevices(baseID string) []draplugin.Device {
	out := make([]draplugin.Device, 0, len(pc.Devices))
	perGPU := pc.perGPUCDI()
	views := perGPU && pc.needsRequestViews()
	for _, dev := range pc.Devices {
		ids := make([]string, 0, 4)
		if perGPU {
			ids = append(ids, dev.CDIDeviceID)
		}
		if baseID != "" {
			ids = append(ids, baseID)
		}
		ids = append(ids, pc.CDIDeviceID)
		if views {
			ids = append(ids, CDIDeviceIDForRequest(pc.UID, viewRequest(dev.Request)))
		}
		out = append(out, draplugin.Device{
			Requests:     []string{dev.Request},
			PoolName:     dev.Pool,
			DeviceName:   dev.Device,
			CDIDeviceIDs: ids,
			ShareID:      dev.ShareID,
		})
	}
	return out
}

// planClaim validates a claim against this node and computes what
// preparing it means, without side effects.
func (d *Driver) planClaim(logger klog.Logger, claim *resourceapi.ResourceClaim) (*PreparedClaim, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, errors.New("status.allocation: not allocated")
	}
	if d.topo == nil {
		return nil, errors.New("no GPU discovery has succeeded yet on this node")
	}
	configs, err := newClaimConfigs(logger, alloc)
	if err != nil {
		return nil, err
	}
	pc := &PreparedClaim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name}
	var resultIdx []int // position in pc.Devices -> index in results
	for i, r := range alloc.Devices.Results {
		if r.Driver != driver.Name {
			continue
		}
		field := resultField(i)
		if r.Pool != d.opts.NodeName {
			return nil, fmt.Errorf("%s.pool: %q is not this node's pool %q", field, r.Pool, d.opts.NodeName)
		}
		if driver.IsPartitionDeviceName(r.Device) {
			if _, err := configs.forRequest(r.Request); err != nil {
				return nil, err
			}
			dev, err := d.planPartition(field, r) // ondemand.go
			if err != nil {
				return nil, err
			}
			resultIdx = append(resultIdx, i)
			pc.Devices = append(pc.Devices, dev)
			continue
		}
		if driver.IsMIGDeviceName(r.Device) {
			if _, err := configs.forRequest(r.Request); err != nil {
				return nil, err
			}
			dev, err := d.planMIG(field, r) // prepare_mig.go
			if err != nil {
				return nil, err
			}
			resultIdx = append(resultIdx, i)
			pc.Devices = append(pc.Devices, dev)
			continue
		}
		index, err := driver.ParseDeviceName(r.Device)
		if err != nil {
			return nil, fmt.Errorf("%s.device: %w", field, err)
		}
		p, ok := d.topo.Position(index)
		if !ok {
			return nil, fmt.Errorf("%s.device: %q: no GPU with index %d on node %s", field, r.Device, index, d.opts.NodeName)
		}
		gpu := d.topo.GPUs[p]
		if gpu.MIGEnabled() {
			return nil, fmt.Errorf("%s.device: %q: GPU %d is in MIG mode on node %s and is given out only as its MIG devices, not whole or in shares", field, r.Device, gpu.Index, d.opts.NodeName)
		}
		rc, err := configs.forRequest(r.Request)
		if err != nil {
			return nil, err
		}
		dev := PreparedDevice{
			Request: r.Request, Pool: r.Pool, Device: r.Device,
			Index: gpu.Index, Minor: gpu.Minor, UUID: gpu.UUID, PCIBusID: gpu.PCIBusID,
			ShareID:     r.ShareID,
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
		}
		if r.ShareID != nil {
			share, err := d.planShare(field, r, gpu, rc)
			if err != nil {
				return nil, err
			}
			dev.Share = share
		}
		resultIdx = append(resultIdx, i)
		pc.Devices = append(pc.Devices, dev)
	}
	if err := checkClaimShape(pc, resultIdx); err != nil {
		return nil, err
	}
	if err := checkClaimPriority(pc, resultIdx); err != nil {
		return nil, err
	}
	if err := d.checkConflicts(pc, resultIdx); err != nil {
		return nil, err
	}
	if err := d.checkMIGConflicts(pc, resultIdx); err != nil {
		return nil, err
	}
	if err := d.checkPartitionConflicts(pc, resultIdx); err != nil {
		return nil, err
	}
	if len(pc.Devices) > 0 {
		pc.CDIDeviceID = CDIDeviceID(pc.UID)
		for i := range pc.Devices {
			pc.Devices[i].CDIDeviceID = CDIDeviceIDForDevice(pc.UID, pc.Devices[i].Device)
		}
	}
	return pc, nil
}

// resultField names an allocation result in error messages.
func resultField(i int) string {
	return fmt.Sprintf("status.allocation.devices.results[%d]", i)
}

// planShare works out the size and strategy of a share.
func (d *Driver) planShare(field string, r resourceapi.DeviceRequestAllocationResult, gpu topology.GPU, rc *requestConfig) (*PreparedShare, error) {
	strategy := rc.resolved.Sharing.Strategy
	if strategy == apiv1alpha1.SharingNone {
		// The controller refuses such requests; a claim allocated by
		// anyone else must not get a share it would refuse either.
		return nil, fmt.Errorf("%s: a share (shareID set) under sharing.strategy=%s, which gives out whole GPUs only", field, apiv1alpha1.SharingNone)
	}
	var explicitMem *resource.Quantity
	var explicitCores *int64
	if s := rc.explicit.Sharing; s != nil {
		explicitMem, explicitCores = s.DefaultMemory, s.DefaultCores
	}
	mem, ok := consumed(r, driver.CapacityMemory)
	switch {
	case ok:
	case explicitMem != nil:
		mem = *explicitMem
	default:
		mem = d.opts.DefaultShareMemory
	}
	var cores int64
	if q, ok := consumed(r, driver.CapacityCores); ok {
		cores = q.Value()
	} else if explicitCores != nil {
		cores = *explicitCores
	} else {
		cores = d.opts.DefaultShareCores
	}
	memBytes := mem.Value()
	memField := field + ".consumedCapacity." + driver.CapacityMemory
	switch {
	case memBytes < sliceformat.MemoryStep:
		return nil, fmt.Errorf("%s: %s: a share needs at least 1Mi of memory", memField, mem.String())
	case gpu.MemoryBytes > 0 && memBytes > gpu.MemoryBytes:
		return nil, fmt.Errorf("%s: %s is larger than GPU %d's %s", memField, mem.String(), gpu.Index,
			resource.NewQuantity(gpu.MemoryBytes, resource.BinarySI).String())
	}
	if cores < 1 || cores > sliceformat.CoresTotal {
		return nil, fmt.Errorf("%s.consumedCapacity.%s: %d: must be between 1 and %d", field, driver.CapacityCores, cores, sliceformat.CoresTotal)
	}
	ps := &PreparedShare{MemoryBytes: memBytes, Cores: cores, Strategy: strategy}
	if v := rc.resolved.Sharing.MemoryOvercommitPercent; v != nil {
		ps.MemoryOvercommitPercent = *v
	}
	if v := rc.resolved.Sharing.Priority; v != nil {
		p := *v
		ps.Priority = &p
	}
	if rc.resolved.ConcurrentMPS() {
		ps.MPSMode = apiv1alpha1.MPSConcurrent
	}
	return ps, nil
}

// consumed looks a capacity up in a result's consumedCapacity, qualified
// with the driver name or not.
func consumed(r resourceapi.DeviceRequestAllocationResult, name string) (resource.Quantity, bool) {
	if q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(name)]; ok {
		return q, true
	}
	q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(driver.Name+"/"+name)]
	return q, ok
}

// checkClaimShape rejects combinations the claim's containers cannot be
// set up for: a GPU given whole and in shares (or whole twice) in one
// claim, shares of one GPU with different strategies, MPS shares asking
// different core percentages on different GPUs (one MPS server has one
// active thread percentage), MPS shares of both modes, and Concurrent MPS
// shares on more than one GPU (each GPU has its group's daemon, and a
// container reaches one). MPS shares beside GPUs outside MPS are fine:
// each request's containers get their own view (cdiviews.go).
func checkClaimShape(pc *PreparedClaim, resultIdx []int) error {
	field := func(j int) string { return resultField(resultIdx[j]) }
	whole := map[int]int{}
	shared := map[int]int{}
	strategy := map[int]apiv1alpha1.SharingStrategy{}
	mpsGPU := -1
	if err := checkClaimMPSMode(pc, field); err != nil {
		return err
	}
	for j, dev := range pc.Devices {
		if dev.MIG != nil {
			continue // exclusive devices of their own: checkMIGConflicts
		}
		if dev.Share == nil {
			if k, ok := whole[dev.Index]; ok {
				return fmt.Errorf("%s.device: %q is allocated whole twice (also in %s)", field(j), dev.Device, field(k))
			}
			if k, ok := shared[dev.Index]; ok {
				return fmt.Errorf("%s.device: %q is allocated whole and as a share (%s) in the same claim", field(j), dev.Device, field(k))
			}
			whole[dev.Index] = j
			continue
		}
		if k, ok := whole[dev.Index]; ok {
			return fmt.Errorf("%s.device: %q is allocated as a share and whole (%s) in the same claim", field(j), dev.Device, field(k))
		}
		if s, ok := strategy[dev.Index]; ok && s != dev.Share.Strategy {
			return fmt.Errorf("%s: shares of %q use sharing strategies %s and %s; one GPU takes one strategy", field(j), dev.Device, s, dev.Share.Strategy)
		}
		strategy[dev.Index] = dev.Share.Strategy
		if _, ok := shared[dev.Index]; !ok {
			shared[dev.Index] = j
		}
		if dev.Share.Strategy == apiv1alpha1.SharingMPS && mpsGPU < 0 {
			mpsGPU = dev.Index
		}
	}
	if mpsGPU < 0 {
		return nil
	}
	// The summed percentages per GPU, as the daemon and the container's
	// GPULINK_SHARE_CORES_<n> get them.
	var first *claimGPU
	for _, g := range claimGPUs(pc) {
		if g.share == nil || g.share.Strategy != apiv1alpha1.SharingMPS {
			continue
		}
		if first == nil {
			first = &g
			continue
		}
		if g.share.Cores != first.share.Cores {
			j := shared[g.index]
			return fmt.Errorf("%s.consumedCapacity.%s: the claim's MPS shares ask %d%% of the cores of GPU %d and %d%% of GPU %d; one MPS server applies one active thread percentage to all the claim's GPUs, so ask the same on each", field(j), driver.CapacityCores, first.share.Cores, first.index, g.share.Cores, g.index)
		}
	}
	return nil
}

// checkClaimMPSMode refuses a claim whose MPS shares mix the two modes
// (its containers reach one MPS daemon, the claim's own or its group's)
// and a claim with Concurrent MPS shares on more than one GPU (its group
// has a daemon per GPU, and a client reaches one daemon).
func checkClaimMPSMode(pc *PreparedClaim, field func(int) string) error {
	first, firstGPU := -1, -1
	for j, dev := range pc.Devices {
		if dev.Share == nil || dev.Share.Strategy != apiv1alpha1.SharingMPS {
			continue
		}
		if first < 0 {
			first = j
			if dev.Share.concurrentMPS() {
				firstGPU = dev.Index
			}
			continue
		}
		if a, b := pc.Devices[first].Share.concurrentMPS(), dev.Share.concurrentMPS(); a != b {
			return fmt.Errorf("%s: sharing.mpsMode %s, but %s has %s; a container reaches one MPS daemon, so a claim's MPS shares must all come from classes of one MPS mode",
				field(j), mpsModeName(b), field(first), mpsModeName(a))
		}
		if dev.Share.concurrentMPS() && dev.Index != firstGPU {
			return fmt.Errorf("%s.device: %q, but %s is on GPU %d: Concurrent MPS shares are served by their namespace's MPS daemon on their GPU and a container reaches one daemon, so a claim's Concurrent MPS shares must all be on one GPU (sharing.mpsMode %s)",
				field(j), dev.Device, field(first), firstGPU, apiv1alpha1.MPSConcurrent)
		}
	}
	if first >= 0 && firstGPU >= 0 && pc.Namespace == "" {
		return fmt.Errorf("%s: a Concurrent MPS share of a claim without a namespace: its namespace is its sharing group", field(first))
	}
	return nil
}

// mpsModeName names a share's MPS mode in messages.
func mpsModeName(concurrent bool) apiv1alpha1.MPSMode {
	if concurrent {
		return apiv1alpha1.MPSConcurrent
	}
	return apiv1alpha1.MPSIsolated
}

// checkConflicts is the last line of defense against double allocation:
// a GPU given whole must not be in any other prepared claim, shares of
// one GPU must fit into it together, in memory and in cores (as the
// controller counts them), and a GPU with Concurrent MPS shares carries
// only Concurrent MPS shares of one namespace (checkMPSGroups).
// Admin-access results are exempt.
func (d *Driver) checkConflicts(pc *PreparedClaim, resultIdx []int) error {
	type usage struct {
		wholeBy     types.UID
		mem, cores  int64
		shareClaims int
		mpsGroups
	}
	used := map[int]*usage{}
	for uid, other := range d.cp.Claims {
		if uid == pc.UID {
			continue
		}
		for _, dev := range other.Devices {
			if dev.AdminAccess || dev.MIG != nil {
				continue
			}
			u := used[dev.Index]
			if u == nil {
				u = &usage{}
				used[dev.Index] = u
			}
			if dev.Share == nil {
				u.wholeBy = uid
				continue
			}
			u.mem += dev.Share.MemoryBytes
			u.cores += dev.Share.Cores
			u.shareClaims++
			u.add(other, dev.Share)
		}
	}
	for j, dev := range pc.Devices {
		if dev.AdminAccess || dev.MIG != nil {
			continue
		}
		field := resultField(resultIdx[j])
		u := used[dev.Index]
		if u == nil {
			u = &usage{}
			used[dev.Index] = u
		}
		if u.wholeBy != "" {
			return fmt.Errorf("%s.device: %q is already prepared whole for claim UID %s", field, dev.Device, u.wholeBy)
		}
		if dev.Share == nil {
			if u.shareClaims > 0 {
				return fmt.Errorf("%s.device: %q is allocated whole but %d share(s) of it are prepared for other claims", field, dev.Device, u.shareClaims)
			}
			continue
		}
		if err := u.check(pc, dev); err != nil {
			return fmt.Errorf("%s.device: %w", field, err)
		}
		u.mem += dev.Share.MemoryBytes
		u.cores += dev.Share.Cores
		u.shareClaims++
		p, _ := d.topo.Position(dev.Index)
		// The claim's class may opt in to memory over-commit, as the
		// controller honours it: the shares then may add up to that
		// percentage of the GPU's memory.
		if total := d.topo.GPUs[p].MemoryBytes; total > 0 {
			limit, pct := total, dev.Share.MemoryOvercommitPercent
			if pct > 100 {
				limit = total / 100 * int64(pct)
			}
			if u.mem > limit {
				if pct > 100 {
					return fmt.Errorf("%s.consumedCapacity.%s: shares of %q would use %d bytes, more than %d%% of the GPU's %d (sharing.memoryOvercommitPercent)", field, driver.CapacityMemory, dev.Device, u.mem, pct, total)
				}
				return fmt.Errorf("%s.consumedCapacity.%s: shares of %q would use %d bytes, more than the GPU's %d", field, driver.CapacityMemory, dev.Device, u.mem, total)
			}
		}
		if u.cores > sliceformat.CoresTotal {
			return fmt.Errorf("%s.consumedCapacity.%s: shares of %q would use %d%% of the cores, more than the GPU's %d%%", field, driver.CapacityCores, dev.Device, u.cores, sliceformat.CoresTotal)
		}
	}
	return nil
}

// apply performs the side effects of a planned claim: the MIG instances
// of its partitions, MPS daemon references, then the CDI spec. On error
// everything done is undone.
func (d *Driver) apply(ctx context.Context, pc *PreparedClaim) error {
	if len(pc.Devices) == 0 {
		return nil
	}
	if err := d.createPartitions(ctx, pc); err != nil {
		return errors.Join(err, d.destroyPartitions(ctx, pc))
	}
	spec, err := buildClaimSpec(klog.FromContext(ctx), pc, d.cdiOptions())
	if err != nil {
		return errors.Join(fmt.Errorf("building CDI spec: %w", err), d.destroyPartitions(ctx, pc))
	}
	for i := range pc.Devices {
		dev := &pc.Devices[i]
		if dev.Share == nil || dev.Share.Strategy != apiv1alpha1.SharingMPS {
			continue
		}
		if err := d.mps.EnsureDaemon(ctx, pc.mpsShare()); err != nil {
			// A kept daemon (mps.ErrDaemonKept) holds a reference; this
			// prepare fails, so releasing it stops that daemon.
			dev.Share.MPSRef = errors.Is(err, mps.ErrDaemonKept)
			return errors.Join(fmt.Errorf("%s: %w", dev.Device, err), d.releaseMPS(ctx, pc), d.destroyPartitions(ctx, pc))
		}
		dev.Share.MPSRef = true
	}
	if err := d.cdi.WriteClaimSpec(pc.UID, spec); err != nil {
		return errors.Join(err, d.releaseMPS(ctx, pc), d.cdi.RemoveClaimSpec(pc.UID), d.destroyPartitions(ctx, pc))
	}
	return nil
}

// teardown undoes apply; it can be retried after a partial failure. The
// CDI spec goes first, so that no container starts with an instance
// about to be destroyed.
func (d *Driver) teardown(ctx context.Context, pc *PreparedClaim) error {
	if err := d.cdi.RemoveClaimSpec(pc.UID); err != nil {
		return err
	}
	if err := d.releaseMPS(ctx, pc); err != nil {
		return err
	}
	return d.destroyPartitions(ctx, pc)
}

// releaseMPS drops the claim's MPS daemon references, clearing each one it
// released so a retry does not release it twice.
func (d *Driver) releaseMPS(ctx context.Context, pc *PreparedClaim) error {
	var errs []error
	for i := range pc.Devices {
		dev := &pc.Devices[i]
		if dev.Share == nil || !dev.Share.MPSRef {
			continue
		}
		if err := d.mps.ReleaseDaemon(ctx, pc.mpsShare()); err != nil {
			errs = append(errs, err)
			continue
		}
		dev.Share.MPSRef = false
	}
	return errors.Join(errs...)
}

// mpsShare is the claim's MPS share: its daemon's identity (the claim's
// own daemon, or for Concurrent shares its namespace's on their one GPU),
// its GPUs in the order its containers number them, and its limits, the
// sum of the claim's MPS results on each GPU (like the container's
// GPULINK_SHARE_* values). The cores are the same on every GPU
// (checkClaimShape); the smallest is taken should a checkpoint say
// otherwise.
func (pc *PreparedClaim) mpsShare() mps.Share {
	s := mps.Share{Claim: pc.UID}
	for _, g := range claimGPUs(pc) {
		if g.share == nil || g.share.Strategy != apiv1alpha1.SharingMPS {
			continue
		}
		if g.share.concurrentMPS() {
			s.Group = pc.Namespace
		}
		s.GPUs = append(s.GPUs, mps.Device{GPU: mps.GPU{Index: g.index, UUID: g.uuid}, MemoryBytes: g.share.MemoryBytes})
		if s.Cores == 0 || g.share.Cores < s.Cores {
			s.Cores = g.share.Cores
		}
	}
	return s
}

// mpsGroups is what checkConflicts knows of a GPU's shares for the MPS
// modes: a Concurrent MPS share's limits are set by its own clients, in
// their environment, and the clients of its namespace on the GPU share
// one server, so a GPU with Concurrent shares may carry only Concurrent
// shares of that one namespace. A share of another namespace would need a
// second server (which the GPU time-slices against the first) and would
// not be protected from the group's clients raising their own limits; an
// Isolated MPS, HAMi-core or unlimited share no more. The controller
// places shares by the same rule.
type mpsGroups struct {
	// group is the namespace of the GPU's Concurrent MPS shares, groupBy
	// one of their claims; otherBy is a claim with a share of the GPU that
	// is not a Concurrent MPS share, other that share's kind.
	group            string
	groupBy, otherBy types.UID
	other            string
}

// add records another prepared claim's share.
func (g *mpsGroups) add(claim *PreparedClaim, s *PreparedShare) {
	if s.concurrentMPS() {
		g.group, g.groupBy = claim.Namespace, claim.UID
		return
	}
	g.otherBy, g.other = claim.UID, shareKind(s)
}

// check refuses dev, a share of pc, on a GPU whose shares it cannot join.
func (g *mpsGroups) check(pc *PreparedClaim, dev PreparedDevice) error {
	s := dev.Share
	switch {
	case s.concurrentMPS() && g.group != "" && g.group != pc.Namespace:
		return fmt.Errorf("%q carries Concurrent MPS shares of namespace %s (claim UID %s), whose MPS server serves that namespace only: a Concurrent MPS share of namespace %s cannot join it",
			dev.Device, g.group, g.groupBy, pc.Namespace)
	case s.concurrentMPS() && g.otherBy != "":
		return fmt.Errorf("%q carries a share that is not a Concurrent MPS share (%s, claim UID %s): a Concurrent MPS share's limits are set by its own clients, which that share would not be protected from, so it needs a GPU without other kinds of shares",
			dev.Device, g.other, g.otherBy)
	case !s.concurrentMPS() && g.group != "":
		return fmt.Errorf("%q carries Concurrent MPS shares of namespace %s (claim UID %s), whose clients set their own limits: this share (%s) would not be protected from them, so it cannot join the GPU",
			dev.Device, g.group, g.groupBy, shareKind(s))
	}
	return nil
}

// shareKind names a share's mechanism in messages: "Isolated MPS",
// "Concurrent MPS", "HAMiCore" or "None".
func shareKind(s *PreparedShare) string {
	if s.Strategy != apiv1alpha1.SharingMPS {
		return string(s.Strategy)
	}
	return string(mpsModeName(s.concurrentMPS())) + " MPS"
}
