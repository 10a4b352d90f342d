package controller

import (
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpulink/gpulink/controller/report"
)

func TestReleaseSettlesExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newReleaseSettles()
	s.now = func() time.Time { return now }
	uid := types.UID("claim-1")
	if d := s.left(uid); d != 0 {
		t.Fatalf("unmarked claim waits %v", d)
	}
	s.mark(uid)
	if d := s.left(uid); d != releaseSettle {
		t.Errorf("just marked: waits %v, want %v", d, releaseSettle)
	}
	now = now.Add(releaseSettle - time.Millisecond)
	if d := s.left(uid); d != time.Millisecond {
		t.Errorf("1 ms before the end: waits %v", d)
	}
	now = now.Add(time.Millisecond)
	if d := s.left(uid); d != 0 {
		t.Errorf("at the end: waits %v", d)
	}
	if _, kept := s.until[uid]; kept {
		t.Error("expired record kept")
	}
	s.mark(uid)
	s.forget(uid)
	if d := s.left(uid); d != 0 {
		t.Errorf("forgotten claim waits %v", d)
	}
}

// statusWrites records when a claim's allocation was first removed and
// when it was next written with one.
type statusWrites struct {
	mu                       sync.Mutex
	releasedAt, reallocation time.Time
}

func (w *statusWrites) watch(h *harness, name string) {
	h.onClaimUpdate(&w.mu, func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error) {
		if act.GetSubresource() != "status" || c.Name != name {
			return false, nil, nil
		}
		switch {
		case c.Status.Allocation == nil && w.releasedAt.IsZero():
			w.releasedAt = time.Now()
		case c.Status.Allocation != nil && !w.releasedAt.IsZero() && w.reallocation.IsZero():
			w.reallocation = time.Now()
		}
		return false, nil, nil
	})
}

func (w *statusWrites) gap() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.releasedAt.IsZero() || w.reallocation.IsZero() {
		return 0, false
	}
	return w.reallocation.Sub(w.releasedAt), true
}

// TestUnschedulableReleaseSettlesBeforeReallocation: the claim of a pod
// kube-scheduler holds (gate removed, unbound) is released because the
// pod is unschedulable on its node; kube-scheduler may be in that pod's
// PreBind with the old allocation, and a re-read there would reserve
// whatever the claim holds. So the claim is allocated on the other node
// only after the settle time, never in between.
func TestUnschedulableReleaseSettlesBeforeReallocation(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, UnschedulableGrace: 50 * time.Millisecond},
		objs(classes(), gpuNode(t, "a", "v100-sxm2-8-aliyun-sccgn6.txt"), gpuNode(t, "b", "v100-sxm2-8-aliyun-sccgn6.txt"))...)
	const settle = 400 * time.Millisecond
	h.ctrl.settles.settle = settle
	var writes statusWrites
	writes.watch(h, "c")
	h.start()
	first := h.unschedulableOnFirstNode("c", "p")
	h.eventually("claim reallocated on the other node", func() bool {
		c := h.getClaim("c")
		return c.Status.Allocation != nil && allocatedNode(c) != first
	})
	gap, ok := writes.gap()
	if !ok {
		t.Fatal("release and reallocation not both seen")
	}
	if gap < settle {
		t.Errorf("claim allocated again %v after its release under a handed-over pod, want at least the settle time %v", gap, settle)
	}
}

// TestRollbackOfGatedDecisionDoesNotSettle: a failed decision of a pod
// that still carries the gate is rolled back; no pod of kube-scheduler's
// uses the claim, so the retry may allocate it without waiting.
func TestRollbackOfGatedDecisionDoesNotSettle(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var mu sync.Mutex
	var allocations, rollbacks, settled int
	h.onClaimUpdate(&mu, func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error) {
		switch {
		case act.GetSubresource() != "status":
		case c.Status.Allocation == nil:
			// releaseClaim marks a claim before its write.
			rollbacks++
			if h.ctrl.settles.left(c.UID) > 0 {
				settled++
			}
		default:
			allocations++
			if allocations == 2 {
				// The decision's second write fails: its first is
				// rolled back.
				return true, nil, apierrors.NewTooManyRequests("injected", 1)
			}
		}
		return false, nil, nil
	})
	h.start()
	h.oneGPUClaims("a", "b")
	h.pod("p", true, "a", "b")
	h.waitAllocated("a")
	h.waitAllocated("b")
	h.waitUngated("p")
	mu.Lock()
	defer mu.Unlock()
	if rollbacks == 0 {
		t.Fatal("nothing rolled back; the test does not exercise a rollback")
	}
	if settled > 0 {
		t.Errorf("%d claims rolled back under a gated pod were held from their next allocation", settled)
	}
}

// TestSettlingClaimHoldsGangDecision: a gang whose member's claim was
// released moments ago under a pod kube-scheduler holds (a claim shared
// with such a pod) is decided only once the settle time has passed,
// every member's claim with it.
func TestSettlingClaimHoldsGangDecision(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...)
	const settle = 400 * time.Millisecond
	h.ctrl.settles.settle = settle
	var mu sync.Mutex
	var firstAllocation time.Time
	h.onClaimUpdate(&mu, func(act clienttesting.Action, c *resourceapi.ResourceClaim) (bool, runtime.Object, error) {
		if act.GetSubresource() == "status" && c.Status.Allocation != nil && firstAllocation.IsZero() {
			firstAllocation = time.Now()
		}
		return false, nil, nil
	})
	h.start()
	p0 := h.newGangPod("p0", "train", 2, 4, nil)
	p1 := h.newGangPod("p1", "train", 2, 4, nil)
	marked := time.Now()
	h.ctrl.settles.mark(h.getClaim("p1").UID)
	h.createGangPod(p0)
	h.createGangPod(p1)
	h.waitUngated("p0")
	h.waitUngated("p1")
	mu.Lock()
	defer mu.Unlock()
	if gap := firstAllocation.Sub(marked); gap < settle {
		t.Errorf("gang's first claim allocated %v after its member's claim was marked, want at least the settle time %v", gap, settle)
	}
}

// TestSettleAfterWaitingGangStillPlaces: a gang that waited for room
// (its evaluation recorded as waiting) and then finds a member's claim
// settling is evaluated again when the settle time ends, although nothing
// else changed: the settle must not be taken for another wait on the same
// state, which the gang's runs skip until the cluster changes.
func TestSettleAfterWaitingGangStillPlaces(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"))...)
	const settle = 300 * time.Millisecond
	h.ctrl.settles.settle = settle
	h.start()
	h.gangPod("p0", "train", 2, 4, nil)
	h.gangPod("p1", "train", 2, 4, nil)
	h.waitEventWith(ns+"/p1", report.ReasonGangWaiting, "gang train")
	h.ctrl.settles.mark(h.getClaim("p1").UID)
	h.addLeafNodes("l1", "b")
	h.waitUngated("p0")
	h.waitUngated("p1")
}
