package kubeletplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// Rolling updates.
//
// With Options.RollingUpdateUID set (the pod's UID, from the downward
// API) the helper registers under a socket name of its own
// (kubeletplugin.RollingUpdate), so a DaemonSet may start the new plugin
// pod on a node (maxSurge 1) before the old one stops; the kubelet (1.33
// and later) sends its calls to the newest registered instance, and calls
// already under way finish on the old one. Both instances share the
// plugin data directory: the checkpoint, the CDI specs and the MPS
// daemons. The helper serializes its gRPC calls across instances with a
// file lock, but the plugin keeps the checkpoint in memory and works on
// it outside gRPC calls too (recovery at start, the MPS limit loop), so
// it does not rely on that lock. Instead:
//
//   - Every use of the shared state (a prepare or unprepare call, the
//     recovery at start, the MPS limit loop's view of the daemons) holds
//     an exclusive flock on <plugin dir>/checkpoint.lock, nested inside
//     the helper's lock where there is one, and first reads the checkpoint
//     again when another instance has written it since (syncCheckpoint).
//     So two instances preparing at the same time never lose each other's
//     entries, the conflict check sees the other's GPUs, either can
//     unprepare what the other prepared, and a starting instance neither
//     rolls back a prepare that is under way in the other (it cannot be:
//     the other holds the lock for the whole call) nor removes its CDI
//     specs or MPS daemons as orphans.
//   - MPS daemon references follow the checkpoint: a claim the other
//     instance prepared is adopted without restarting its daemon, and one
//     it unprepared is forgotten without stopping anything (it stopped
//     the daemon).
//   - Only one instance publishes ResourceSlices: the holder of an flock
//     on <plugin dir>/publisher.lock. The new instance waits for it, so an
//     old and a new version never fight over the slices' content; the old
//     one's slices stay in place (the kubelet deletes a driver's slices
//     only when no instance stays registered), and the new one takes over
//     when the old one exits.
//
// Without RollingUpdateUID the same locks are taken; with one instance
// they never wait.

const (
	checkpointLockFile = "checkpoint.lock"
	publisherLockFile  = "publisher.lock"
)

// rollingState is the Driver's part in sharing the plugin directory.
type rollingState struct {
	// lock is the open checkpoint.lock; flocked while the state is used.
	lock *os.File
}

// openStateLock opens (creating) the checkpoint lock file.
func (d *Driver) openStateLock() error {
	path := filepath.Join(d.opts.PluginDataDir, checkpointLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening checkpoint lock %s: %w", path, err)
	}
	d.rolling.lock = f
	return nil
}

// flock takes an exclusive flock on f, polling so that ctx can end the
// wait. flock locks belong to the open file description, so two Drivers
// in one process (tests) exclude each other as two processes do.
func flock(ctx context.Context, f *os.File) error {
	wait := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the lock on %s (held by another instance of the plugin): %w", f.Name(), context.Cause(ctx))
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

func funlock(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

// lockState takes d.mu and the checkpoint lock and brings d.cp up to date
// with what another instance wrote. The returned function releases both.
func (d *Driver) lockState(ctx context.Context) (func(), error) {
	d.mu.Lock()
	if err := flock(ctx, d.rolling.lock); err != nil {
		d.mu.Unlock()
		return nil, err
	}
	unlock := func() {
		funlock(d.rolling.lock)
		d.mu.Unlock()
	}
	if err := d.syncCheckpoint(ctx); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// syncCheckpoint reads the checkpoint again when it is not what this
// instance last read or wrote. A checkpoint that does not decode fails the
// call and is left alone: it may be a newer version's (during an upgrade
// the old instance can still get a call) and only the recovery at start
// moves a corrupt one aside.
func (d *Driver) syncCheckpoint(ctx context.Context) error {
	raw, err := os.ReadFile(d.ckpt.Path())
	if err != nil {
		// Not another instance's doing: instances replace the file by a
		// rename, never remove it. Go on from this instance's state;
		// writing it reports a file system problem per claim.
		klog.FromContext(ctx).V(2).Info("Cannot read the checkpoint, going on from this instance's state", "err", err.Error())
		return nil
	}
	if bytes.Equal(raw, d.ckpt.last) {
		return nil
	}
	cp, err := d.ckpt.Load()
	if err != nil {
		return fmt.Errorf("another instance of the plugin changed the checkpoint: %w", err)
	}
	if cp.BootID == "" {
		cp.BootID = d.cp.BootID
	}
	logger := klog.FromContext(ctx)
	if d.dirty {
		logger.Info("Dropping checkpoint changes this instance could not write; another instance wrote the checkpoint since")
	}
	// A claim still in PrepareStarted cannot be under way: its instance
	// would hold the lock. That instance died in the call; roll the claim
	// back as the recovery at start would, so that the kubelet's retry
	// prepares it here. Its MPS daemon, if it got that far, is counted
	// as referenced, so that the rollback stops it.
	var interrupted []*PreparedClaim
	for _, pc := range cp.Claims {
		if pc.State == PrepareCompleted {
			continue
		}
		for i := range pc.Devices {
			if s := pc.Devices[i].Share; s != nil && s.Strategy == apiv1alpha1.SharingMPS {
				s.MPSRef = true
			}
		}
		interrupted = append(interrupted, pc)
	}
	d.followMPSRefs(logger, d.cp, cp)
	d.cp = cp
	d.dirty = false
	for _, pc := range interrupted {
		logger.Info("Rolling back a prepare another instance of the plugin did not finish", "claim", klog.KRef(pc.Namespace, pc.Name), "uid", pc.UID)
		if err := d.teardown(ctx, pc); err != nil {
			return fmt.Errorf("rolling back claim %s/%s (UID %s), which another instance did not finish preparing: %w", pc.Namespace, pc.Name, pc.UID, err)
		}
		delete(cp.Claims, pc.UID)
		d.dirty = true
	}
	d.metrics.PreparedClaims.Set(float64(len(cp.Claims)))
	d.metrics.PreparedGPUs.set(d.opts.NodeName, cp)
	logger.V(3).Info("Read the checkpoint another instance wrote", "claims", len(cp.Claims))
	return nil
}

// refAdjuster is implemented by MPS managers whose references can follow
// another instance's prepares and unprepares without starting or stopping
// a daemon.
type refAdjuster interface {
	AdjustRefs(share mps.Share, delta int)
}

// followMPSRefs makes this instance's MPS references match cp: each
// MPSRef of a claim is one reference (apply takes one per MPS result).
func (d *Driver) followMPSRefs(logger klog.Logger, old, cp *Checkpoint) {
	adj, ok := d.mps.(refAdjuster)
	if !ok {
		return
	}
	count := func(pc *PreparedClaim) int {
		n := 0
		for _, dev := range pc.Devices {
			if dev.Share != nil && dev.Share.MPSRef {
				n++
			}
		}
		return n
	}
	seen := map[string]bool{}
	for uid, pc := range cp.Claims {
		seen[string(uid)] = true
		had := 0
		if o := old.Claims[uid]; o != nil {
			had = count(o)
		}
		if delta := count(pc) - had; delta != 0 {
			adj.AdjustRefs(pc.mpsShare(), delta)
			logger.V(3).Info("Following another instance's MPS daemon references", "claim", klog.KRef(pc.Namespace, pc.Name), "delta", delta)
		}
	}
	for uid, o := range old.Claims {
		if seen[string(uid)] {
			continue
		}
		if n := count(o); n > 0 {
			adj.AdjustRefs(o.mpsShare(), -n)
		}
	}
}

// syncMPSRefs brings the MPS references up to date before the limit loop
// uses them, so it does not reach for daemons another instance stopped.
func (d *Driver) syncMPSRefs(ctx context.Context) error {
	unlock, err := d.lockState(ctx)
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// holdPublisherLock waits until this instance may publish ResourceSlices
// (see above) and returns the function that gives the right up.
func (d *Driver) holdPublisherLock(ctx context.Context) (func(), error) {
	path := filepath.Join(d.opts.PluginDataDir, publisherLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening publisher lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		klog.FromContext(ctx).Info("Another instance of the plugin publishes the ResourceSlices; waiting until it exits", "lock", path)
		if err := flock(ctx, f); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	return func() { _ = f.Close() }, nil
}
