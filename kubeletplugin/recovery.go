package kubeletplugin

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// recoverState loads the checkpoint and makes the node match it:
//
//   - A checkpoint of another version (ErrCheckpointVersion: a rollback
//     from a newer plugin) stops the start before anything is touched.
//     One with fields this version does not know is used for what it
//     knows, and a copy of the file is kept (checkpoint.json.newer).
//   - A corrupt checkpoint is moved aside as checkpoint.json.corrupt and
//     the plugin starts with no prepared claims (every CDI spec of ours is
//     then stray and removed); the kubelet prepares the claims of pods it
//     still runs again, which rewrites their specs. Refusing to start
//     instead would leave the node unable to start any GPU pod until a
//     human deletes the file, while the claims themselves live in the API.
//   - A checkpoint from an earlier boot is void: after a reboot no daemon
//     runs and no container uses the devices.
//   - Claims left in PrepareStarted are rolled back, including an MPS
//     daemon their interrupted apply may have started.
//   - MPS daemon references are rebuilt from the claims that hold them.
//   - MPS daemons (pods, directories) of claims that are not prepared are
//     removed.
//   - CDI specs of claims that are not prepared are removed.
//   - GPUs named by --mig-on-demand are adopted or refused, and MIG
//     instances on adopted GPUs that no prepared claim holds are destroyed
//     (ondemand.go).
func (d *Driver) recoverState(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	bootID, err := d.bootID()
	if err != nil {
		return err
	}
	cp, unknown, err := d.ckpt.LoadTolerant()
	switch {
	case errors.Is(err, ErrCheckpointVersion):
		// A rollback from a newer version: its claims may be in use by
		// running pods, and tearing down what this version cannot read
		// would break them. Start nothing, destroy nothing.
		return fmt.Errorf("%w; refusing to start rather than remove the CDI specs, MPS daemons and MIG instances of claims running pods may use: run the plugin version that wrote it, or, once no pod on this node uses a GPU, delete %s", err, d.ckpt.Path())
	case errors.Is(err, ErrCorruptCheckpoint):
		d.metrics.CheckpointCorruptions.Inc()
		moved, mvErr := d.ckpt.MoveAside()
		if mvErr != nil {
			return errors.Join(err, mvErr)
		}
		logger.Error(err, "CHECKPOINT CORRUPT: moved it aside and starting with no prepared claims; stray CDI specs will be removed and the kubelet re-prepares the claims of running pods", "movedTo", moved)
		cp = newCheckpoint(bootID)
		d.stateLost = true
	case err != nil:
		return err
	case cp.BootID != "" && cp.BootID != bootID:
		logger.Info("Node rebooted since the checkpoint was written, dropping its claims", "checkpointBootID", cp.BootID, "bootID", bootID, "claims", len(cp.Claims))
		cp = newCheckpoint(bootID)
	}
	if unknown != "" && err == nil {
		// A newer version wrote it (a rollback): keep its file for a
		// roll forward or a post-mortem; the claims are read as this
		// version knows them and kept.
		kept, cerr := d.ckpt.KeepCopy(newerCheckpointSuffix)
		logger.Info("Checkpoint has fields this plugin version does not know (written by a newer version?); using what it knows and keeping its claims", "unknown", unknown, "copy", kept, "copyErr", cerr)
	}
	cp.BootID = bootID
	d.cp = cp

	// An interrupted apply may have started an MPS daemon after
	// PrepareStarted was recorded (MPSRef is only written with
	// PrepareCompleted). Count such shares as holding a reference: taking
	// it adopts a running daemon (or starts one), and the rollback's
	// release stops it.
	for _, pc := range cp.Claims {
		if pc.State == PrepareCompleted {
			continue
		}
		for _, dev := range pc.Devices {
			if dev.Share != nil && dev.Share.Strategy == apiv1alpha1.SharingMPS {
				dev.Share.MPSRef = true
			}
		}
	}
	// Rebuild MPS references first (adopting each claim's daemon pod), so
	// that rolling back a half-prepared claim below stops its daemon.
	for _, pc := range cp.Claims {
		for i := range pc.Devices {
			dev := &pc.Devices[i]
			if dev.Share == nil || !dev.Share.MPSRef {
				continue
			}
			if err := d.mps.EnsureDaemon(ctx, pc.mpsShare()); err != nil {
				logger.Error(err, "Restoring MPS daemon reference failed; a daemon that may serve the claim's containers is kept and started again every --mps-limit-interval", "claim", klog.KRef(pc.Namespace, pc.Name), "device", dev.Device)
				// A kept daemon (one that existed, or whose state the
				// API server did not tell) still holds its reference, so
				// that the claim's unprepare stops it and the limits loop
				// retries it (mps.Manager.RetryKept).
				dev.Share.MPSRef = errors.Is(err, mps.ErrDaemonKept)
			}
		}
	}
	for uid, pc := range cp.Claims {
		if pc.State == PrepareCompleted {
			continue
		}
		logger.Info("Rolling back interrupted prepare", "claim", klog.KRef(pc.Namespace, pc.Name), "uid", uid, "state", pc.State)
		if err := d.teardown(ctx, pc); err != nil {
			return fmt.Errorf("rolling back claim %s/%s (UID %s): %w", pc.Namespace, pc.Name, uid, err)
		}
		delete(cp.Claims, uid)
	}
	// MIG on demand: adopt or refuse the GPUs, destroy orphaned instances
	// (after the rollbacks above destroyed those of interrupted prepares).
	changed, err := d.reconcileOnDemand(ctx)
	if err != nil {
		return err
	}
	d.onDemandChanged = changed
	// Daemons of claims that are not prepared serve nobody: after a reboot
	// their pods sit Failed, after a lost checkpoint or a failed stop they
	// keep running. Not fatal: the next start tries again.
	keep := make(map[string]bool, len(cp.Claims))
	for uid, pc := range cp.Claims {
		keep[string(uid)] = true
		// A group's daemon is kept while any claim of the group on its
		// GPU is prepared, even where restoring its reference failed.
		if s := pc.mpsShare(); len(s.GPUs) > 0 {
			keep[s.ID()] = true
		}
	}
	if removed, err := d.mps.RemoveOrphans(ctx, keep); err != nil {
		logger.Error(err, "Removing orphaned MPS control daemons failed; the next plugin start tries again", "removed", removed)
	} else if len(removed) > 0 {
		logger.Info("Removed orphaned MPS control daemons of claims that are not prepared", "claimUIDs", removed)
	}
	uids, err := d.cdi.ListClaimSpecs()
	if err != nil {
		return err
	}
	have := map[types.UID]bool{}
	for _, uid := range uids {
		if _, ok := cp.Claims[uid]; ok {
			have[uid] = true
			continue
		}
		if err := d.cdi.RemoveClaimSpec(uid); err != nil {
			return fmt.Errorf("removing stray CDI spec: %w", err)
		}
		logger.Info("Removed stray CDI spec of a claim that is not prepared", "uid", uid)
	}
	// A prepared claim whose spec vanished (someone cleaned the CDI
	// directory) gets it back: containers of its pods may still start.
	for uid, pc := range cp.Claims {
		if have[uid] || len(pc.Devices) == 0 {
			continue
		}
		spec, err := buildClaimSpec(logger, pc, d.cdiOptions())
		if err == nil {
			err = d.cdi.WriteClaimSpec(uid, spec)
		}
		if err != nil {
			logger.Error(err, "Restoring the CDI spec of a prepared claim failed", "claim", klog.KRef(pc.Namespace, pc.Name), "uid", uid)
			continue
		}
		logger.Info("Restored missing CDI spec of a prepared claim", "claim", klog.KRef(pc.Namespace, pc.Name), "uid", uid)
	}
	if err := d.store(); err != nil {
		return err
	}
	logger.Info("Recovered prepared claims", "claims", len(cp.Claims), "uids", claimUIDs(cp))
	return nil
}

func claimUIDs(cp *Checkpoint) []types.UID {
	out := make([]types.UID, 0, len(cp.Claims))
	for uid := range cp.Claims {
		out = append(out, uid)
	}
	return out
}
