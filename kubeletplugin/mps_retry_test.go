package kubeletplugin

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// A plugin that starts while the API server gives no definite answer
// keeps the prepared claim's MPS daemon and its reference
// (mps.ErrDaemonKept), and its limits loop starts the daemon again once
// the API answers; the claim's unprepare then stops it.
func TestRestartRetriesKeptMPSDaemon(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("mps", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	mustPrepare(t, d, c)
	id := string(c.UID)
	starts := e.daemon.Starts[id]

	e.daemon.StartErr = fmt.Errorf("getting node for the daemon pod's owner: etcd leader changed: %w", mps.ErrDaemonKept)
	e.opts.MPSLimitInterval = 10 * time.Millisecond
	d = e.start()
	if e.daemon.Stops[id] != 0 {
		t.Fatalf("the claim's daemon was stopped at start: %v", e.daemon.Stops)
	}
	if pc := d.cp.Claims[c.UID]; pc == nil || !pc.Devices[0].Share.MPSRef {
		t.Fatalf("the claim's daemon reference was dropped: %+v", pc)
	}
	e.daemon.StartErr = nil
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.runMPSLimits(ctx)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !e.daemon.IsRunning(id) || e.daemon.StartCount(id) == starts {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("the limits loop did not start the kept daemon again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	mustUnprepare(t, d, c)
	if e.daemon.IsRunning(id) {
		t.Error("daemon still running after the claim's unprepare")
	}
}
