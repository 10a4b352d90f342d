package controller

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
)

// TestSharedClaimDecidedOnce: two pods referencing one claim, processed
// by two workers at the same time, must decide the claim once. Both pods
// pass the cache-based checks before either takes the decision lock; the
// write of the first decision is held back so that the second pod
// decides while it is in flight.
func TestSharedClaimDecidedOnce(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true}, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	release := make(chan struct{})
	var attempts atomic.Int32
	var mu sync.Mutex
	var firstDevices []string
	h.client.PrependReactor("update", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		c, ok := a.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		if !ok || c.Name != "shared" || a.GetSubresource() != "status" {
			return false, nil, nil
		}
		if attempts.Add(1) == 1 {
			mu.Lock()
			firstDevices = devicesOf(c)
			mu.Unlock()
		}
		<-release
		return false, nil, nil
	})
	h.start()
	h.claim("shared", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.ctrl.decideMu.Lock()
	h.pod("p1", true, "shared")
	h.pod("p2", true, "shared")
	// Let both workers reach the decision lock.
	time.Sleep(300 * time.Millisecond)
	h.ctrl.decideMu.Unlock()
	h.eventually("first allocation write", func() bool { return attempts.Load() >= 1 })
	// Give the second pod the chance to decide while the write is held.
	time.Sleep(300 * time.Millisecond)
	inv := h.ctrl.inv.All()
	if len(inv) != 1 {
		t.Fatalf("inventory has %d nodes", len(inv))
	}
	var held []string
	for p, u := range h.ctrl.ledger.NodeUsage(inv[0]) {
		if u.Exclusive {
			held = append(held, inv[0].Devices[p].Name)
		}
	}
	mu.Lock()
	want := firstDevices
	mu.Unlock()
	if len(held) != 1 || len(want) != 1 || held[0] != want[0] {
		t.Errorf("ledger holds %v while the decision %v is being written; want exactly that decision", held, want)
	}
	if n := attempts.Load(); n != 1 {
		t.Errorf("claim written by %d decisions, want 1", n)
	}
	close(release)
	h.waitUngated("p1")
	h.waitUngated("p2")
	if got := devicesOf(h.getClaim("shared")); len(got) != 1 || got[0] != want[0] {
		t.Errorf("claim allocated %v, want %v", got, want)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// TestLedgerRefusesSecondAssumption: an assumption is never overwritten
// by another decision for the same claim, and a claim the informer shows
// allocated cannot be assumed again.
func TestLedgerRefusesSecondAssumption(t *testing.T) {
	l := planner.NewLedger()
	first := []planner.DeviceUse{{Key: planner.DeviceKey{Pool: "n", Device: "gpu-0"}, Exclusive: true}}
	settle, ok := l.Assume("s", first)
	if !ok {
		t.Fatal("first assumption refused")
	}
	key1 := planner.DeviceKey{Pool: "n", Device: "gpu-1"}
	if _, ok := l.Assume("s", []planner.DeviceUse{{Key: key1, Exclusive: true}}); ok {
		t.Fatal("second assumption for the same claim accepted")
	}
	if got := l.UsageOf(planner.DeviceKey{Pool: "n", Device: "gpu-0"}); !got.Exclusive {
		t.Errorf("gpu-0 usage %+v after a refused second assumption, want exclusive", got)
	}
	if got := l.UsageOf(key1); got.Exclusive {
		t.Errorf("gpu-1 usage %+v, want free: the refused decision must leave no trace", got)
	}
	settle("10", true)
	if _, ok := l.Assume("s", []planner.DeviceUse{{Key: key1, Exclusive: true}}); ok {
		t.Fatal("assumption accepted while the written one is not observed yet")
	}
	l.Observe(controllertest.ClaimWith("s", "10", controllertest.WholeResult("gpu-0")))
	if _, ok := l.Assume("s", []planner.DeviceUse{{Key: key1, Exclusive: true}}); ok {
		t.Fatal("assumption accepted for a claim the informer shows allocated")
	}
	if got := l.UsageOf(planner.DeviceKey{Pool: "n", Device: "gpu-0"}); !got.Exclusive {
		t.Errorf("gpu-0 usage %+v, want exclusive", got)
	}
	// Deallocated: it may be decided again.
	l.Observe(controllertest.ClaimWith("s", "11"))
	if _, ok := l.Assume("s", []planner.DeviceUse{{Key: key1, Exclusive: true}}); !ok {
		t.Fatal("assumption refused for a deallocated claim")
	}
}
