package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
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
