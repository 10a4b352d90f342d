package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// lostRV numbers the writes applyLost applies, above withResourceVersions'.
var lostRV atomic.Int64

func init() { lostRV.Store(900000) }

// applyLost applies an update to the fake API server as it would apply it
// (resourceVersion checked and advanced) and returns the error a client
// sees when the response is lost: the write landed, the caller cannot tell.
func applyLost(client interface {
	Tracker() clienttesting.ObjectTracker
}, ua clienttesting.UpdateAction) error {
	obj := ua.GetObject().DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	cur, err := client.Tracker().Get(ua.GetResource(), ua.GetNamespace(), m.GetName())
	if err != nil {
		return err
	}
	if cm, err := meta.Accessor(cur); err != nil || cm.GetResourceVersion() != m.GetResourceVersion() {
		return apierrors.NewConflict(ua.GetResource().GroupResource(), m.GetName(), fmt.Errorf("stale resourceVersion %s", m.GetResourceVersion()))
	}
	m.SetResourceVersion(strconv.FormatInt(lostRV.Add(1), 10))
	if err := client.Tracker().Update(ua.GetResource(), obj, ua.GetNamespace(), metav1.UpdateOptions{}); err != nil {
		return err
	}
	return fmt.Errorf("injected: response lost after the write was applied: %w", context.DeadlineExceeded)
}

// deallocations records the status writes that remove a claim's
// allocation, by claim name, from the moment armed is set.
type deallocations struct {
	mu    sync.Mutex
	armed bool
	names []string
}

func (d *deallocations) watch(h *harness) {
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		c, ok := act.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		if ok && act.GetSubresource() == "status" && c.Status.Allocation == nil {
			d.mu.Lock()
			if d.armed {
				d.names = append(d.names, c.Name)
			}
			d.mu.Unlock()
		}
		return false, nil, nil
	})
}

func (d *deallocations) arm() {
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
}

func (d *deallocations) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.names)
}

// TestTimedOutWriteThatWasAppliedIsKept: pod p has claims a and b; the API
// server applies b's allocation but the response is lost (a timeout). The
// write landed, so the decision is complete: nothing of it is rolled back,
// p is ungated with the devices of that one decision. (Rolling it back
// raced kube-scheduler: it binds a pod whose claims are reserved for it
// without writing them, and the rollback then took the devices of a bound
// pod; issue 33.)
func TestTimedOutWriteThatWasAppliedIsKept(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var dealloc deallocations
	var lost atomic.Bool
	// Prepended last, so it runs first: the fault, then the recorder.
	dealloc.watch(h)
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		ua := act.(clienttesting.UpdateAction)
		c, ok := ua.GetObject().(*resourceapi.ResourceClaim)
		if !ok || act.GetSubresource() != "status" || c.Name != "b" || c.Status.Allocation == nil || !lost.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		dealloc.arm()
		return true, nil, applyLost(h.client, ua)
	})
	h.start()
	h.oneGPUClaims("a", "b")
	h.pod("p", true, "a", "b")
	h.waitUngated("p")
	a, b := h.waitAllocated("a"), h.waitAllocated("b")
	if !lost.Load() {
		t.Fatal("fault not injected")
	}
	if d := dealloc.seen(); len(d) > 0 {
		t.Errorf("claims %v deallocated after b's write was applied; a decision whose writes landed must stand", d)
	}
	if n := testutil.ToFloat64(h.ctrl.metrics.Released.WithLabelValues("rollback")); n != 0 {
		t.Errorf("%v rollbacks counted", n)
	}
	t.Logf("a=%v b=%v", devicesOf(a), devicesOf(b))
	if err := controllertest.CheckInvariants(h.allClaims(), h.allSlices()); err != nil {
		t.Error(err)
	}
}

// TestReservationOnlyForBoundPods: the controller writes a pod into
// reservedFor only when the pod is bound already. A gated or ungated pod's
// reservation is kube-scheduler's to write in PreBind, against the claim's
// resourceVersion, so that a rollback or release by the controller and a
// binding can never both succeed.
func TestReservationOnlyForBoundPods(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	for _, name := range []string{"gated", "ungated", "bound"} {
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	}
	h.pod("gated", true, "gated")
	h.pod("ungated", false, "ungated")
	bound := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bound", Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "bound", ResourceClaimName: ptr.To("bound")}}},
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, bound, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gated", "ungated"} {
		if c := h.waitAllocated(name); len(c.Status.ReservedFor) != 0 {
			t.Errorf("claim of the %s pod reserved for %v by the controller; want it left to kube-scheduler", name, c.Status.ReservedFor)
		}
	}
	c := h.waitAllocated("bound")
	if len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != bound.UID {
		t.Errorf("claim of the bound pod reserved for %v, want the pod (kube-scheduler is done with it)", c.Status.ReservedFor)
	}
	if got := allocatedNode(c); got != "a" {
		t.Errorf("claim of the pod bound to a allocated on %q", got)
	}
}

// TestBoundPodKeepsPartOfFailedDecision: a pod bound with two unallocated
// claims (its claims were taken from it, or it was created with a node
// name) is on its node for good; when the second write fails, the first
// claim is kept rather than rolled back, and the retry allocates the
// second on the same node.
func TestBoundPodKeepsPartOfFailedDecision(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var dealloc deallocations
	var failed atomic.Bool
	dealloc.watch(h)
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		c, ok := act.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		if !ok || act.GetSubresource() != "status" || c.Name != "b" || c.Status.Allocation == nil || !failed.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		dealloc.arm()
		return true, nil, apierrors.NewTooManyRequests("injected", 1)
	})
	h.start()
	h.oneGPUClaims("a", "b")
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "a", ResourceClaimName: ptr.To("a")}, {Name: "b", ResourceClaimName: ptr.To("b")}}},
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := h.waitAllocated("a"), h.waitAllocated("b")
	if !failed.Load() {
		t.Fatal("fault not injected")
	}
	if d := dealloc.seen(); len(d) > 0 {
		t.Errorf("claims %v of a bound pod deallocated after a failed write", d)
	}
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if allocatedNode(c) != "a" || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != p.UID {
			t.Errorf("claim %s: node %q, reservedFor %v; want node a, the pod", c.Name, allocatedNode(c), c.Status.ReservedFor)
		}
	}
}

// TestUnschedulableReleaseSkipsReservedClaim: a pod left unschedulable on
// the node of its claims has them released, but never a claim that
// kube-scheduler has reserved for it: kube-scheduler reserves in PreBind
// and then binds without writing the claim again, so the pod may be bound
// right now and no resourceVersion check would catch a release. An
// unreserved claim is released (the release carries its resourceVersion,
// so a reservation landing first makes it conflict).
func TestUnschedulableReleaseSkipsReservedClaim(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, UnschedulableGrace: 1},
		objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	for _, name := range []string{"free", "reserved"} {
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
		h.pod(name, true, name)
		h.waitAllocated(name)
		h.waitUngated(name)
	}
	h.reserve(h.getPod("reserved"))
	for _, name := range []string{"free", "reserved"} {
		p := h.getPod(name)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 node(s) didn't have free ports"}}
		if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.eventually("pods seen unschedulable", func() bool {
		for _, name := range []string{"free", "reserved"} {
			p, err := h.ctrl.pods.Pods(ns).Get(name)
			if err != nil || !podUnschedulable(p) {
				return false
			}
		}
		c, err := h.ctrl.claims.ResourceClaims(ns).Get("reserved")
		return err == nil && len(c.Status.ReservedFor) == 1
	})
	// Called directly so that the outcome does not depend on when the
	// workers get to the pods.
	for _, name := range []string{"free", "reserved"} {
		pod, err := h.ctrl.pods.Pods(ns).Get(name)
		if err != nil {
			t.Fatal(err)
		}
		pc := h.ctrl.collectClaims(h.ctx, pod)
		if err := h.ctrl.checkUnschedulable(h.ctx, pod, pc); err != nil && !apierrors.IsConflict(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if c := h.getClaim("reserved"); c.Status.Allocation == nil || len(c.Status.ReservedFor) != 1 {
		t.Errorf("claim reserved by kube-scheduler released: allocation %v, reservedFor %v", c.Status.Allocation != nil, c.Status.ReservedFor)
	}
	h.eventually("unreserved claim released and the node excluded", func() bool {
		return h.ctrl.excludedNodes(h.getPod("free")).Has("a")
	})
}

// TestCleanupKeepsSharedClaimOfLivePod: a shared claim whose only
// reservation belongs to a pod that is gone, while another live pod
// references it (about to be bound with it), loses the dead pod's
// reservation but keeps its allocation.
func TestCleanupKeepsSharedClaimOfLivePod(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
	var dealloc deallocations
	dealloc.watch(h)
	h.start()
	h.claim("s", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}})
	h.pod("first", true, "s")
	h.waitAllocated("s")
	h.waitUngated("first")
	h.bindRunning("first", "a")
	h.pod("second", true, "s")
	h.waitUngated("second")
	dealloc.arm()
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the gone pod's reservation dropped", func() bool { return len(h.getClaim("s").Status.ReservedFor) == 0 })
	if d := dealloc.seen(); len(d) > 0 || h.getClaim("s").Status.Allocation == nil {
		t.Errorf("shared claim deallocated (status writes without allocation: %v) while pod second still references it", d)
	}
}

// TestCleanupRetriesClaimWithDecisionInFlight: the clean-up of a claim
// being deleted that finds a decision's write in flight retries with
// backoff; when the write fails, nothing else brings the claim back, and
// it would keep gpulink's finalizer until a resync (never, with resync 0).
func TestCleanupRetriesClaimWithDecisionInFlight(t *testing.T) {
	now := metav1.Now()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}, DeletionTimestamp: &now},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}},
	}
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"), []runtime.Object{claim})...)
	settle, ok := h.ctrl.ledger.Assume(claim.UID, nil)
	if !ok {
		t.Fatal("assumption refused")
	}
	h.start()
	h.eventually("clean-up found the decision in flight", func() bool { return h.ctrl.gcQueue.NumRequeues(ns+"/t") > 0 })
	settle("", false)
	h.eventually("finalizer removed once the decision failed", func() bool { return !hasFinalizer(h.getClaim("t")) })
}

// TestCleanupWaitsBeforeReleasingUnreferencedClaim: an allocated claim no
// pod in the cache references is released only after ReleaseGrace, since
// the pod that uses it may not be in the cache yet while kube-scheduler
// binds it with that allocation.
func TestCleanupWaitsBeforeReleasingUnreferencedClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		grace    time.Duration
		released bool
	}{{"within the grace", time.Hour, false}, {"after the grace", 20 * time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, ReleaseGrace: tc.grace},
				objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...)
			c := h.allocatedOrphan("late")
			h.start()
			if tc.released {
				h.eventually("claim released after the grace", func() bool { return h.getClaim("late").Status.Allocation == nil })
				return
			}
			h.eventually("clean-up found the claim unreferenced", func() bool {
				h.ctrl.mu.Lock()
				defer h.ctrl.mu.Unlock()
				_, ok := h.ctrl.unwanted[c.UID]
				return ok
			})
			if h.getClaim("late").Status.Allocation == nil {
				t.Error("allocated claim released within the grace")
			}
		})
	}
}
