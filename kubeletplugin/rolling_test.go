package kubeletplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
)

// Two plugin instances on one plugin directory, as during a DaemonSet
// rolling update with maxSurge: the kubelet may call either, concurrently.
func TestTwoInstancesShareTheCheckpoint(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d1 := e.start()
	d2 := e.start()

	// 30 MPS shares on gpu-0..2, prepared through both at once.
	var claims []*resourceapi.ResourceClaim
	for i := range 30 {
		claims = append(claims, newClaim(fmt.Sprintf("c%d", i), []resourceapi.DeviceRequestAllocationResult{shareOf("s", i%3, "256Mi", 3)}))
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(claims))
	for i, c := range claims {
		d := d1
		if i%2 == 1 {
			d = d2
		}
		wg.Go(func() {
			res, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{c})
			if err == nil {
				err = res[c.UID].Err
			}
			if err != nil {
				errs <- fmt.Errorf("prepare %s: %w", c.Name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	cp := readCheckpoint(t, e)
	for _, c := range claims {
		pc := cp.Claims[c.UID]
		if pc == nil || pc.State != PrepareCompleted {
			t.Errorf("claim %s: checkpoint entry %+v, want PrepareCompleted", c.Name, pc)
		}
		if !e.specExists(c.UID) {
			t.Errorf("claim %s: no CDI spec", c.Name)
		}
		if n := e.daemon.Starts[string(c.UID)]; n != 1 {
			t.Errorf("claim %s: MPS daemon started %d times, want once", c.Name, n)
		}
	}

	// Each sees the other's GPUs: a GPU prepared whole by one instance
	// is refused by the other.
	w1 := newClaim("w1", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)})
	w2 := newClaim("w2", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)})
	mustPrepare(t, d1, w1)
	if r := prepare(t, d2, w2)[w2.UID]; r.Err == nil || !strings.Contains(r.Err.Error(), "already prepared whole for another claim") {
		t.Errorf("second instance prepared gpu-3 again: error %v", r.Err)
	}
	// The kubelet asks the other instance for a claim already prepared:
	// answered from the checkpoint, nothing done twice.
	if devs := mustPrepare(t, d2, claims[0]); len(devs) != 1 || e.daemon.Starts[string(claims[0].UID)] != 1 {
		t.Errorf("claim prepared by the other instance: devices %v, MPS daemon starts %d", devs, e.daemon.Starts[string(claims[0].UID)])
	}

	// A third instance starting now recovers without rolling back or
	// removing anything the others prepared.
	d3 := e.start()
	if n := len(readCheckpoint(t, e).Claims); n != len(claims)+1 {
		t.Errorf("%d claims after a third instance started, want %d", n, len(claims)+1)
	}

	// Each unprepares what the other prepared; every daemon stops once.
	for i, c := range claims {
		d := d2
		if i%2 == 1 {
			d = d1
		}
		mustUnprepare(t, d, c)
	}
	mustUnprepare(t, d3, w1)
	if n := len(readCheckpoint(t, e).Claims); n != 0 {
		t.Errorf("%d claims left after unpreparing all", n)
	}
	for _, c := range claims {
		if e.specExists(c.UID) {
			t.Errorf("claim %s: CDI spec left", c.Name)
		}
		if n := e.daemon.Stops[string(c.UID)]; n != 1 {
			t.Errorf("claim %s: MPS daemon stopped %d times, want once", c.Name, n)
		}
	}
	// The instances' MPS references follow: none is left to reassert.
	for i, d := range []*Driver{d1, d2, d3} {
		if err := d.syncMPSRefs(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := d.mps.(interface{ Daemons() int }).Daemons(); n != 0 {
			t.Errorf("instance %d still references %d MPS daemons", i+1, n)
		}
	}
}

// holdLock flocks a file of the plugin directory as another instance
// would and returns its release.
func holdLock(t *testing.T, path string) func() {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { _ = f.Close() }) }
	t.Cleanup(release)
	return release
}

// While another instance holds the checkpoint lock (a call under way),
// a starting instance does not recover and calls do not run.
func TestStateLockWaitsForTheOtherInstance(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	release := holdLock(t, filepath.Join(e.pluginDir, checkpointLockFile))

	started := make(chan *Driver)
	go func() { started <- e.start() }()
	c := newClaim("c", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)})
	prepared := make(chan error, 1)
	go func() {
		_, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{c})
		prepared <- err
	}()
	select {
	case <-started:
		t.Fatal("an instance recovered while another held the checkpoint lock")
	case err := <-prepared:
		t.Fatalf("a prepare ran while another instance held the checkpoint lock (error %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	d2 := <-started
	if err := <-prepared; err != nil {
		t.Fatal(err)
	}
	if !e.specExists(c.UID) || readCheckpoint(t, e).Claims[c.UID] == nil {
		t.Error("claim not prepared after the lock was released")
	}
	mustUnprepare(t, d2, c)

	// A wait ends with the call's context, naming the lock.
	release = holdLock(t, filepath.Join(e.pluginDir, checkpointLockFile))
	defer release()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); err == nil || !strings.Contains(err.Error(), checkpointLockFile) {
		t.Errorf("error %v, want one naming %s", err, checkpointLockFile)
	}
}

// Only one instance publishes ResourceSlices; the next takes over when it
// is gone.
func TestPublisherLock(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d1, d2 := e.start(), e.start()
	release1, err := d1.holdPublisherLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := d2.holdPublisherLock(ctx); err == nil {
		t.Fatal("two instances hold the publisher lock")
	}
	got := make(chan error, 1)
	go func() {
		release2, err := d2.holdPublisherLock(t.Context())
		if err == nil {
			release2()
		}
		got <- err
	}()
	release1()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second instance did not take over publishing")
	}
}

// An instance that died in a prepare left the claim in PrepareStarted; the
// other instance rolls it back when it next reads the checkpoint, and the
// kubelet's retry prepares it there.
func TestInterruptedPrepareOfTheOtherInstance(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d1, d2 := e.start(), e.start()
	c := newClaim("c", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	// d2 records PrepareStarted and starts the MPS daemon, then dies.
	unlock, err := d2.lockState(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pc, err := d2.planClaim(testLogger(t), c)
	if err != nil {
		t.Fatal(err)
	}
	pc.State = PrepareStarted
	d2.cp.Claims[c.UID] = pc
	if err := d2.store(); err != nil {
		t.Fatal(err)
	}
	if err := d2.mps.EnsureDaemon(t.Context(), pc.mpsShare()); err != nil {
		t.Fatal(err)
	}
	unlock()

	devs := mustPrepare(t, d1, c)
	if len(devs) != 1 {
		t.Fatalf("devices %v", devs)
	}
	if got := readCheckpoint(t, e).Claims[c.UID]; got == nil || got.State != PrepareCompleted {
		t.Fatalf("checkpoint entry %+v, want PrepareCompleted", got)
	}
	if e.daemon.Stops[string(c.UID)] != 1 || e.daemon.Starts[string(c.UID)] != 2 || !e.daemon.IsRunning(string(c.UID)) {
		t.Errorf("MPS daemon starts %d, stops %d, running %t: want the dead instance's stopped and one started again",
			e.daemon.Starts[string(c.UID)], e.daemon.Stops[string(c.UID)], e.daemon.IsRunning(string(c.UID)))
	}
}
