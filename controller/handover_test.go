package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
)

// allocatedOrphan creates a standalone claim allocated on node "a" with
// gpulink's finalizer and no reservation: what a shared claim is after its
// last pod went.
func (h *harness) allocatedOrphan(name string) *resourceapi.ResourceClaim {
	h.t.Helper()
	c := h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	c.Finalizers = []string{driver.ClaimFinalizer}
	c, err := h.client.ResourceV1().ResourceClaims(ns).Update(h.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	now := metav1.Now()
	c.Status.Allocation = &resourceapi.AllocationResult{
		Devices:             resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "g", Driver: driver.Name, Pool: "a", Device: driver.DeviceName(0)}}},
		NodeSelector:        planner.NodeSelectorFor("a"),
		AllocationTimestamp: &now,
	}
	c, err = h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// TestOrphanReleaseConfirmsWithLiveList: a pod naming an allocated
// standalone claim that is in the API server but not yet in the
// controller's cache keeps the claim allocated past the release grace.
func TestOrphanReleaseConfirmsWithLiveList(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, ReleaseGrace: 300 * time.Millisecond},
		objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	c := h.allocatedOrphan("shared")
	other := h.pod("other", false)
	h.start()
	waiting := func() bool {
		h.ctrl.mu.Lock()
		defer h.ctrl.mu.Unlock()
		_, ok := h.ctrl.unwanted[c.UID]
		return ok
	}
	h.eventually("clean-up found no pod for the claim and waits", waiting)
	// A pod update held back holds back the pod created after it too.
	release := h.holdPodUpdates()
	other.Labels = map[string]string{"touched": "yes"}
	if _, err := h.client.CoreV1().Pods(ns).Update(h.ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.pod("late-user", true, "shared")
	h.eventually("clean-up's wait over", func() bool { return !waiting() })
	// The clean-up has run past the grace at least once by now.
	time.Sleep(200 * time.Millisecond)
	if got := testutil.ToFloat64(h.ctrl.metrics.Released.WithLabelValues(releaseReasonOrphaned)); got != 0 {
		t.Fatalf("claim released as no pod's (%v) while a pod not yet in the cache names it", got)
	}
	if h.getClaim("shared").Status.Allocation == nil {
		t.Fatal("claim released while a pod not yet in the cache names it")
	}
	release()
	h.waitUngated("late-user")
	if got := h.getClaim("shared"); got.Status.Allocation == nil || !got.Status.Allocation.AllocationTimestamp.Equal(c.Status.Allocation.AllocationTimestamp) {
		t.Errorf("claim allocation changed under the pod: %+v", got.Status.Allocation)
	}
}

// TestHandOverWaitsForOrphanRelease: a gated pod whose claim is allocated
// keeps its gate while the clean-up releases the claim, and is handed
// over once the release is off.
func TestHandOverWaitsForOrphanRelease(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, ReleaseGrace: time.Hour},
		objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	c := h.allocatedOrphan("shared")
	h.start()
	h.eventually("claim in the cache", func() bool {
		cached, err := h.ctrl.claims.ResourceClaims(ns).Get("shared")
		return err == nil && cached.Status.Allocation != nil
	})
	h.ctrl.beginOrphanRelease(c.UID)
	h.pod("user", true, "shared")
	h.eventually("pod retried while the claim is being released", func() bool {
		return h.ctrl.podQueue.NumRequeues(ns+"/user") > 0
	})
	if gateIndex(h.getPod("user")) < 0 {
		t.Fatal("pod handed over while its allocated claim was being released")
	}
	h.ctrl.endOrphanRelease(c.UID, false)
	h.waitUngated("user")
}

// TestKeptClaimsHeld: the check before a hand-over, claim by claim.
func TestKeptClaimsHeld(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, ReleaseGrace: 30 * time.Millisecond},
		objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	c := h.allocatedOrphan("shared")
	// A pod kube-scheduler has keeps the claim from the clean-up.
	h.pod("user", false, "shared")
	// A claim that is not gpulink's to release is never in the way.
	foreign := c.DeepCopy()
	foreign.Finalizers = nil
	foreign.UID = "foreign"
	h.start()
	h.eventually("claim in the cache", func() bool {
		cached, err := h.ctrl.claims.ResourceClaims(ns).Get("shared")
		return err == nil && cached.ResourceVersion == c.ResourceVersion
	})
	if err := h.ctrl.keptClaimsHeld([]*resourceapi.ResourceClaim{c, foreign}); err != nil {
		t.Fatalf("allocated claim, nothing releasing it: %v", err)
	}

	h.ctrl.beginOrphanRelease(c.UID)
	if err := h.ctrl.keptClaimsHeld([]*resourceapi.ResourceClaim{c}); !errors.Is(err, errClaimBeingReleased) {
		t.Errorf("release in progress: got %v, want errClaimBeingReleased", err)
	}
	// A release write that failed may have landed: the mark stays for the
	// grace, then the cache decides.
	h.ctrl.endOrphanRelease(c.UID, true)
	if err := h.ctrl.keptClaimsHeld([]*resourceapi.ResourceClaim{c}); !errors.Is(err, errClaimBeingReleased) {
		t.Errorf("release failed just now: got %v, want errClaimBeingReleased", err)
	}
	h.eventually("failed release's mark expired", func() bool { return h.ctrl.keptClaimsHeld([]*resourceapi.ResourceClaim{c}) == nil })

	// Released, the cache not showing it yet.
	released := c.DeepCopy()
	released.ResourceVersion = "999999"
	h.ctrl.claimVersions.saw(released)
	if err := h.ctrl.keptClaimsHeld([]*resourceapi.ResourceClaim{c}); !errors.Is(err, errClaimBeingReleased) {
		t.Errorf("released, cache behind: got %v, want errClaimBeingReleased", err)
	}
	h.ctrl.claimVersions.forget(c.UID)

	replaced := c.DeepCopy()
	replaced.UID = "replaced"
	if err := h.ctrl.keptClaimsHeld([]*resourceapi.ResourceClaim{replaced}); !errors.Is(err, errClaimBeingReleased) {
		t.Errorf("claim replaced since the decision: got %v, want errClaimBeingReleased", err)
	}
}
