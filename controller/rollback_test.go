package controller

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

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
	h.onClaimUpdate(&mu, func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error) {
		if act.GetSubresource() != "status" {
			return false, nil, nil
		}
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
	h.oneGPUClaims("a", "b")
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
	h.onClaimUpdate(&mu, func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error) {
		if act.GetSubresource() != "status" {
			return false, nil, nil
		}
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
	h.oneGPUClaims("a", "b")
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

// TestRetryAfterRollbackWaitsForTheCache: pod p has claims a and b; b's
// write fails after a's landed, and a is rolled back while the claim
// informer lags, still showing a allocated. The retry must not take the
// cached a for allocated, allocate b alone and remove p's gate with a
// unallocated (the churn test's over-commit: kube-scheduler then allocates
// a by its own view of the devices); p waits until the informer shows the
// release, then gets both claims.
func TestRetryAfterRollbackWaitsForTheCache(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var mu sync.Mutex
	var bFailed, aReleased, bAlone, ungatedWithoutA bool
	var release func()
	claimsGVR := resourceapi.SchemeGroupVersion.WithResource("resourceclaims")
	h.onClaimUpdate(&mu, func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error) {
		switch {
		case c.Name == "b" && !bFailed:
			// b's first write (its finalizer, or its allocation where
			// it has the finalizer) fails once the cache shows a
			// allocated; from then on the cache shows no further claim
			// update until release.
			for i := 0; i < 500; i++ {
				if cached, err := h.ctrl.claims.ResourceClaims(ns).Get("a"); err == nil && cached.Status.Allocation != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			release = h.holdClaimUpdates()
			bFailed = true
			return true, nil, apierrors.NewTooManyRequests("injected", 1)
		case act.GetSubresource() != "status":
			// Finalizer updates: nothing to record.
		case c.Name == "a" && bFailed && c.Status.Allocation == nil:
			aReleased = true
		case c.Name == "b" && c.Status.Allocation != nil && aReleased:
			obj, err := h.client.Tracker().Get(claimsGVR, ns, "a")
			if a, ok := obj.(*resourceapi.ResourceClaim); err == nil && ok && a.Status.Allocation == nil {
				bAlone = true
			}
		}
		return false, nil, nil
	})
	h.client.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		obj, err := h.client.Tracker().Get(claimsGVR, ns, "a")
		if a, ok := obj.(*resourceapi.ResourceClaim); err == nil && ok && a.Status.Allocation == nil {
			mu.Lock()
			ungatedWithoutA = true
			mu.Unlock()
		}
		return false, nil, nil
	})
	h.start()
	h.oneGPUClaims("a", "b")
	notReady := testutil.ToFloat64(h.ctrl.metrics.Decisions.WithLabelValues(OutcomeNotReady))
	h.pod("p", true, "a", "b")
	h.eventually("a rolled back", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return aReleased
	})
	// The retry: waiting, or (the defect) allocating b alone.
	h.eventually("p retried", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return bAlone || testutil.ToFloat64(h.ctrl.metrics.Decisions.WithLabelValues(OutcomeNotReady)) > notReady
	})
	mu.Lock()
	release()
	mu.Unlock()
	h.waitUngated("p")
	h.waitAllocated("a")
	h.waitAllocated("b")
	mu.Lock()
	defer mu.Unlock()
	if bAlone || ungatedWithoutA {
		t.Errorf("the retry took the cached a, rolled back, for allocated: b allocated alone %t, p's gate removed with a unallocated %t", bAlone, ungatedWithoutA)
	}
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// onClaimUpdate prepends a reactor to claim updates that calls react, with
// mu held, with the claim each update carries; react's answer is the
// reactor's (false: the update goes on to the tracker).
func (h *harness) onClaimUpdate(mu *sync.Mutex, react func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error)) {
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		c, ok := act.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		if !ok {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		return react(act, c)
	})
}
