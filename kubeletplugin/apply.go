package kubeletplugin

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

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
