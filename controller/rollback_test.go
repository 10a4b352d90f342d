package controller

import (
	"sync"
	"sync/atomic"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestPartialAllocationRolledBack: pod p has claims a and b; the status
// write of b fails (HTTP 429) after a's succeeded. What the decision wrote
// to a must be rolled back (as kube-scheduler's Unreserve does) rather
// than kept while p waits, and p must converge once the API recovers.
func TestPartialAllocationRolledBack(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var failures atomic.Int32
	var mu sync.Mutex
	// aHistory records, for each status write of claim a, whether it
	// carries an allocation.
	var aHistory []bool
	var aWritesAtFirstFailure = -1
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		if act.GetSubresource() != "status" {
			return false, nil, nil
		}
		c, ok := act.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		if !ok {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch c.Name {
		case "a":
			aHistory = append(aHistory, c.Status.Allocation != nil)
		case "b":
			if c.Status.Allocation != nil && failures.Load() < 2 {
				if failures.Add(1) == 1 {
					aWritesAtFirstFailure = len(aHistory)
				}
				return true, nil, apierrors.NewTooManyRequests("injected", 1)
			}
		}
		return false, nil, nil
	})
	h.start()
	h.claim("a", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.claim("b", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.pod("p", true, "a", "b")
	h.waitUngated("p")
	a, b := h.waitAllocated("a"), h.waitAllocated("b")
	mu.Lock()
	hist, at := append([]bool(nil), aHistory...), aWritesAtFirstFailure
	mu.Unlock()
	if failures.Load() < 2 || at < 1 {
		t.Fatalf("fault not injected: %d failures, a written %d times before", failures.Load(), at)
	}
	rolledBack := false
	for _, allocated := range hist[at:] {
		if !allocated {
			rolledBack = true
			break
		}
	}
	if !rolledBack {
		t.Errorf("claim a kept its allocation after b's write failed (status writes of a, allocated or not: %v)", hist)
	}
	if len(a.Status.ReservedFor) != 0 || len(b.Status.ReservedFor) != 0 {
		t.Errorf("reservations a=%v b=%v, want none (kube-scheduler reserves when it binds p)", a.Status.ReservedFor, b.Status.ReservedFor)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// TestFailedRollbackIsFinishedBeforeRetry: when rolling back a failed
// decision fails too, the rollback is finished before the pod is decided
// again, so the pod never waits holding part of its devices.
func TestFailedRollbackIsFinishedBeforeRetry(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var mu sync.Mutex
	var bFailed, rollbackFailed bool
	var aReleased bool // a's allocation was removed after the failures
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		if act.GetSubresource() != "status" {
			return false, nil, nil
		}
		c, ok := act.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		if !ok {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case c.Name == "b" && c.Status.Allocation != nil && !bFailed:
			bFailed = true
			return true, nil, apierrors.NewTooManyRequests("injected", 1)
		case c.Name == "a" && bFailed && len(c.Status.ReservedFor) == 0 && !rollbackFailed:
			rollbackFailed = true
			return true, nil, apierrors.NewTooManyRequests("injected", 1)
		case c.Name == "a" && rollbackFailed && c.Status.Allocation == nil:
			aReleased = true
		}
		return false, nil, nil
	})
	h.start()
	h.claim("a", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.claim("b", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.pod("p", true, "a", "b")
	h.waitUngated("p")
	h.waitAllocated("a")
	h.waitAllocated("b")
	mu.Lock()
	defer mu.Unlock()
	if !bFailed || !rollbackFailed {
		t.Fatalf("faults not injected: b failed %v, rollback failed %v", bFailed, rollbackFailed)
	}
	if !aReleased {
		t.Error("claim a was not released after its first rollback failed")
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}
