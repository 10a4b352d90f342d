package controller

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// leafNode is a 4-GPU node (pcie-4.txt) under a leaf switch.
func leafNode(t *testing.T, name, leaf string) []runtime.Object {
	t.Helper()
	objs := gpuNode(t, name, "pcie-4.txt")
	n := objs[0].(*corev1.Node)
	n.Labels = map[string]string{corev1.LabelHostname: name}
	if leaf != "" {
		n.Labels[gang.LabelLeaf] = leaf
	}
	return objs
}

// gangPod creates a gated pod of a label gang with its own claim of
// gpus whole GPUs; extra labels are added to the pod's.
func (h *harness) gangPod(name, gangName string, size, gpus int, extra map[string]string) *corev1.Pod {
	h.t.Helper()
	return h.createGangPod(h.newGangPod(name, gangName, size, gpus, extra))
}

// newGangPod is gangPod's pod and claim, the pod not created yet.
func (h *harness) newGangPod(name, gangName string, size, gpus int, extra map[string]string) *corev1.Pod {
	h.t.Helper()
	h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", int64(gpus))}})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{gangs.LabelGang: gangName, gangs.LabelSize: strconv.Itoa(size)}},
		Spec: corev1.PodSpec{
			Containers:      []corev1.Container{{Name: "c", Image: "x"}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	for k, v := range extra {
		p.Labels[k] = v
	}
	return p
}

// backdatedGang creates the size pods of label gang gangName (named
// prefix0, prefix1, ...; gpus GPUs each, extra labels) as if created age
// ago: a gang that has waited that long, for the starvation bound.
func (h *harness) backdatedGang(prefix, gangName string, size, gpus int, age time.Duration, extra map[string]string) {
	h.t.Helper()
	for i := range size {
		p := h.newGangPod(fmt.Sprintf("%s%d", prefix, i), gangName, size, gpus, extra)
		p.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
		h.createGangPod(p)
	}
}

// createGangPod creates a pod of newGangPod.
func (h *harness) createGangPod(p *corev1.Pod) *corev1.Pod {
	h.t.Helper()
	out, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// allocatedNodes returns the node of each named claim ("" if unallocated).
func (h *harness) allocatedNodes(names ...string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		out[n] = allocatedNode(h.getClaim(n))
	}
	return out
}

// waitEventWith waits for an event of the reason whose note contains sub
// (a gang's pods get several waiting events as the gang grows).
func (h *harness) waitEventWith(object, reason, sub string) recordedEvent {
	h.t.Helper()
	var e recordedEvent
	h.eventually(fmt.Sprintf("event %s on %s containing %q", reason, object, sub), func() bool {
		var ok bool
		e, ok = h.rec.find(object, reason)
		return ok && contains(e.Note, sub)
	})
	return e
}

// samePair tells whether {a, b} is {x, y}.
func samePair(a, b, x, y string) bool { return (a == x && b == y) || (a == y && b == x) }

// settle waits until the controller has handled everything queued: no
// pod in the queue, which the tests that check nothing happened need.
func (h *harness) settle() {
	h.t.Helper()
	h.eventually("pod queue drained", func() bool { return h.ctrl.podQueue.Len() == 0 })
}

// TestGangWaitsForMinCount: a gang of 2 waits, holding nothing, until its
// second pod exists, then both are allocated and ungated.
func TestGangWaitsForMinCount(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
	h.gangPod("p0", "train", 2, 4, nil)
	e := h.waitEvent(ns+"/p0", report.ReasonGangWaiting)
	if !contains(e.Note, "gang train: 1 of 2 pods") {
		t.Errorf("waiting event %q, want it to count 1 of 2 pods", e.Note)
	}
	h.settle()
	if n := allocatedNode(h.getClaim("p0")); n != "" || gateIndex(h.getPod("p0")) < 0 {
		t.Fatalf("lone gang pod allocated on %q or ungated: a gang holds nothing while it waits", n)
	}
	h.gangPod("p1", "train", 2, 4, nil)
	h.waitUngated("p0")
	h.waitUngated("p1")
	nodes := h.allocatedNodes("p0", "p1")
	if nodes["p0"] == "" || nodes["p1"] == "" || nodes["p0"] == nodes["p1"] {
		t.Errorf("gang pods on %v, want one 4-GPU node each", nodes)
	}
	e = h.waitEvent(ns+"/p1", report.ReasonGangPlaced)
	if !contains(e.Note, "2 pods placed together") || !contains(e.Note, "leaf l1") {
		t.Errorf("placed event %q, want 2 pods on leaf l1", e.Note)
	}
}

// TestGangAllOrNothing: 3 pods of 4 GPUs on two 4-GPU nodes never get a
// partial allocation; deleting one pod shrinks the gang below minCount and
// it keeps waiting.
func TestGangAllOrNothing(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
	for i := range 3 {
		h.gangPod(fmt.Sprintf("p%d", i), "big", 3, 4, nil)
	}
	h.waitEventWith(ns+"/p2", report.ReasonGangWaiting, "only 2 fit")
	h.settle()
	for _, c := range h.allClaims() {
		if c.Status.Allocation != nil {
			t.Errorf("claim %s allocated while its gang cannot fit", c.Name)
		}
	}
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "p2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("gang counts its 2 pods", func() bool {
		e, ok := h.rec.find(ns+"/p0", report.ReasonGangWaiting)
		return ok && contains(e.Note, "2 of 3 pods")
	})
	h.settle()
	for _, c := range h.allClaims() {
		if c.Status.Allocation != nil {
			t.Errorf("claim %s allocated after the gang shrank below minCount", c.Name)
		}
	}
}

// TestGangEvaluatedOncePerChange: a change that re-queues every waiting
// pod makes a waiting gang of 3 be evaluated once, not once per pod.
func TestGangEvaluatedOncePerChange(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
	for i := range 3 {
		h.gangPod(fmt.Sprintf("p%d", i), "big", 3, 4, nil)
	}
	h.waitEventWith(ns+"/p0", report.ReasonGangWaiting, "only 2 fit")
	h.settle()
	before, changesBefore := h.ctrl.gangRuns.evaluations.Load(), h.ctrl.gangRuns.changes.Load()
	h.ctrl.enqueueWaiting()
	h.eventually("the gang evaluated again", func() bool { return h.ctrl.gangRuns.evaluations.Load() > before })
	h.eventually("workers idle", func() bool {
		h.ctrl.gangRuns.mu.Lock()
		defer h.ctrl.gangRuns.mu.Unlock()
		return len(h.ctrl.gangRuns.busy) == 0 && h.ctrl.podQueue.Len() == 0
	})
	// The controller's own periodic enqueueWaiting may add a change in
	// between (one in 30 runs under load): each change may cost one
	// evaluation, never one per pod (3 here).
	n, changes := h.ctrl.gangRuns.evaluations.Load()-before, h.ctrl.gangRuns.changes.Load()-changesBefore
	if n < 1 || n > int64(changes) {
		t.Errorf("%d evaluations of the waiting gang after %d changes, want one per change", n, changes)
	}
}

// TestGangFurtherPodStaysInDomain: a pod that joins a running gang with a
// Required leaf is placed alone, but within the running pods' leaf.
func TestGangFurtherPodStaysInDomain(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l2"), leafNode(t, "c", "l2"), leafNode(t, "d", "l2"))...).start()
	req := map[string]string{gangs.LabelLevel: "leaf"}
	h.gangPod("r0", "run", 2, 4, req)
	h.gangPod("r1", "run", 2, 4, req)
	h.waitUngated("r0")
	h.waitUngated("r1")
	// kube-scheduler's part: bind them where their claims are.
	for _, name := range []string{"r0", "r1"} {
		h.bind(name, allocatedNode(h.getClaim(name)))
	}
	h.gangPod("r2", "run", 2, 4, req)
	h.waitUngated("r2")
	nodes := h.allocatedNodes("r0", "r1", "r2")
	if nodes["r2"] == "a" || nodes["r2"] == nodes["r0"] || nodes["r2"] == nodes["r1"] {
		t.Errorf("further pod on %s (gang on %v), want the free node of leaf l2", nodes["r2"], nodes)
	}
}

// TestGangLevels: Required at the leaf level waits while no leaf has room
// for the gang; Preferred spans two leaves with a Warning saying so.
func TestGangLevels(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"), leafNode(t, "c", "l2"))...).start()
	// A singleton takes node b: leaf l1 has one free node, l2 one.
	h.singletonOn("single", "b", 4)

	req := map[string]string{gangs.LabelLevel: gang.LabelLeaf}
	h.gangPod("r0", "req", 2, 4, req)
	h.gangPod("r1", "req", 2, 4, req)
	e := h.waitEventWith(ns+"/r0", report.ReasonGangWaiting, "only 1 fit in one leaf")
	if !contains(e.Note, "gang req: 2 pods × 4 GPUs") || !contains(e.Note, "2 leaves would fit under Preferred") {
		t.Errorf("Required waiting event %q, want the issue's wording", e.Note)
	}
	h.settle()
	if nodes := h.allocatedNodes("r0", "r1"); nodes["r0"] != "" || nodes["r1"] != "" {
		t.Fatalf("Required gang allocated on %v across leaves", nodes)
	}
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "r0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "r1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	pref := map[string]string{gangs.LabelLevel: "leaf", gangs.LabelPolicy: "Preferred"}
	h.gangPod("f0", "pref", 2, 4, pref)
	h.gangPod("f1", "pref", 2, 4, pref)
	h.waitUngated("f0")
	h.waitUngated("f1")
	nodes := h.allocatedNodes("f0", "f1")
	if !samePair(nodes["f0"], nodes["f1"], "a", "c") {
		t.Errorf("Preferred gang on %v, want nodes a and c (one per leaf)", nodes)
	}
	e = h.waitEvent(ns+"/f0", report.ReasonGangRelaxed)
	if e.Type != corev1.EventTypeWarning || !contains(e.Note, "leaves") {
		t.Errorf("relaxed event %+v, want a Warning naming the leaves spanned", e)
	}
}

// TestGangRecovery: a controller that stopped between a gang's writes
// left one pod's claim allocated and the other's not. The next run rolls
// the written claim back (the gang cannot fit, so it must not keep part
// of its devices); a gang whose every claim was written is ungated.
func TestGangRecovery(t *testing.T) {
	alloc := func(name, node string) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}}}}
		if node != "" {
			var results []resourceapi.DeviceRequestAllocationResult
			for i := range 4 {
				results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "g", Driver: driver.Name, Pool: node, Device: driver.DeviceName(i)})
			}
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}, NodeSelector: nodeSelector(node)}
		}
		return c
	}
	pod := func(name string, claim *resourceapi.ResourceClaim, g string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), Labels: map[string]string{gangs.LabelGang: g, gangs.LabelSize: "2"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(claim.Name)}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}}
		// No reservation: the controller writes none for a pod it has
		// not seen bound, and kube-scheduler none for a gated pod.
		return p
	}
	// Gang "half": x0 written on node a, x1 not; only node a exists, so
	// after the rollback the gang waits ("only 1 fit").
	x0c, x1c := alloc("x0", "a"), alloc("x1", "")
	x0, x1 := pod("x0", x0c, "half"), pod("x1", x1c, "half")
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), []runtime.Object{x0c, x1c, x0, x1})...).start()
	h.waitEvent(ns+"/x0", report.ReasonGangRolledBack)
	h.eventually("x0's claim released", func() bool { return h.getClaim("x0").Status.Allocation == nil })
	h.waitEventWith(ns+"/x1", report.ReasonGangWaiting, "only 1 fit")
	h.settle()
	if gateIndex(h.getPod("x0")) < 0 || gateIndex(h.getPod("x1")) < 0 {
		t.Error("a pod of the rolled-back gang lost its gate")
	}

	// Gang "full": both claims written on nodes b and c, gates still on.
	y0c, y1c := alloc("y0", "b"), alloc("y1", "c")
	y0, y1 := pod("y0", y0c, "full"), pod("y1", y1c, "full")
	h2 := newHarness(t, objs(classes(), leafNode(t, "b", "l1"), leafNode(t, "c", "l1"), []runtime.Object{y0c, y1c, y0, y1})...).start()
	h2.waitUngated("y0")
	h2.waitUngated("y1")
	if n := h2.allocatedNodes("y0", "y1"); n["y0"] != "b" || n["y1"] != "c" {
		t.Errorf("complete gang's claims moved: %v", n)
	}
}

func nodeSelector(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}
}

// TestGangWriteFailureRollsBack: the second pod's claim write fails; the
// first pod's written claim is released before the gang is retried, and
// no gate is removed until both are written.
func TestGangWriteFailureRollsBack(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...)
	var mu sync.Mutex
	failed := false
	var history []string // "name+" allocation written, "name-" removed
	h.client.PrependReactor("update", "resourceclaims", func(act clienttesting.Action) (bool, runtime.Object, error) {
		if act.GetSubresource() != "status" {
			return false, nil, nil
		}
		c := act.(clienttesting.UpdateAction).GetObject().(*resourceapi.ResourceClaim)
		mu.Lock()
		defer mu.Unlock()
		if c.Name == "w1" && c.Status.Allocation != nil && !failed {
			failed = true
			return true, nil, apierrors.NewTooManyRequests("injected", 1)
		}
		sign := "-"
		if c.Status.Allocation != nil {
			sign = "+"
		}
		if len(history) == 0 || history[len(history)-1] != c.Name+sign {
			// A release writes twice (reservation, then allocation).
			history = append(history, c.Name+sign)
		}
		return false, nil, nil
	})
	h.start()
	h.gangPod("w0", "wf", 2, 4, nil)
	h.gangPod("w1", "wf", 2, 4, nil)
	h.waitUngated("w0")
	h.waitUngated("w1")
	mu.Lock()
	defer mu.Unlock()
	if !failed {
		t.Fatal("the injected failure never happened")
	}
	// w0 written, rolled back after w1 failed, then both written.
	want := []string{"w0+", "w0-", "w0+", "w1+"}
	if fmt.Sprint(history) != fmt.Sprint(want) {
		t.Errorf("status writes %v, want %v", history, want)
	}
}

// TestGangStarvation: a gang that waited longer than the bound reserves
// the leaf it is closest to fitting in; a singleton that would fit there
// waits, and the gang runs once the pod in its way ends.
func TestGangStarvation(t *testing.T) {
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{StarvationBound: 10 * time.Minute}}
	h := newHarnessWith(t, cfg, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
	h.claim("old", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("old", true, "old")
	h.waitUngated("old")
	oldNode := allocatedNode(h.getClaim("old"))
	// The gang was created an hour ago: past the bound.
	h.backdatedGang("g", "starved", 2, 4, time.Hour, nil)
	e := h.waitEvent(ns+"/g0", report.ReasonGangReserved)
	if !contains(e.Note, "reserving leaf l1") {
		t.Errorf("reservation event %q, want leaf l1", e.Note)
	}
	m := h.ctrl.metrics
	if got, nodes := testutil.ToFloat64(m.GangReservations), testutil.ToFloat64(m.GangReservedNodes); got != 1 || nodes != 2 {
		t.Errorf("gang_reservations_total %v, gang_reserved_nodes %v; want 1 and 2 (leaf l1)", got, nodes)
	}
	// A 2-GPU singleton would fit beside "old"; the reservation holds it off.
	h.claim("late", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("late", true, "late")
	w := h.waitEvent(ns+"/late", report.ReasonWaiting)
	if !contains(w.Note, "reserved for a gang") {
		t.Errorf("singleton's waiting event %q, want it to name the reservation", w.Note)
	}
	// "old" ends: the gang fits and runs; the reservation ends and the
	// singleton waits for GPUs like any pod.
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("old's claim released", func() bool {
		return h.getClaim("old").Status.Allocation == nil || len(h.getClaim("old").Status.ReservedFor) == 0
	})
	c := h.getClaim("old")
	c.Status.Allocation, c.Status.ReservedFor = nil, nil
	if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
	h.waitUngated("g0")
	h.waitUngated("g1")
	if n := h.allocatedNodes("g0", "g1"); n["g0"] == n["g1"] || n["g0"] == "" || n["g1"] == "" {
		t.Errorf("starved gang on %v (old was on %s)", n, oldNode)
	}
	if got := testutil.ToFloat64(m.GangReservedNodes); got != 0 {
		t.Errorf("gang_reserved_nodes %v after the gang was placed, want 0", got)
	}
	if got := testutil.ToFloat64(m.GangsPlaced.WithLabelValues("leaf")); got != 1 {
		t.Errorf("gangs_placed_total{level=leaf} %v, want 1", got)
	}
	var wait dto.Metric
	if err := m.GangWait.Write(&wait); err != nil {
		t.Fatal(err)
	}
	if n, sum := wait.GetHistogram().GetSampleCount(), wait.GetHistogram().GetSampleSum(); n != 1 || sum < 3600 {
		t.Errorf("gang_wait_seconds: %d observations summing to %v s, want 1 of at least the hour since the gang's pods were created", n, sum)
	}
	h.settle()
	if gateIndex(h.getPod("late")) < 0 {
		t.Error("singleton ungated although the gang took every GPU")
	}
}

// TestGangStarvationNoReservationWhenItNeverFits: a gang larger than the
// cluster (any namespace can label one) passes the starvation bound but
// reserves nothing: a reservation would keep every other pod off the
// cluster for ever without ever letting the gang run.
func TestGangStarvationNoReservationWhenItNeverFits(t *testing.T) {
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{StarvationBound: 10 * time.Minute}}
	h := newHarnessWith(t, cfg, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
	h.backdatedGang("g", "huge", 3, 4, time.Hour, nil)
	e := h.waitEventWith(ns+"/g0", report.ReasonGangReserved, "reserves nothing")
	if e.Type != corev1.EventTypeWarning || !contains(e.Note, "3 pods × 4 GPUs even idle") {
		t.Errorf("event %s %q, want a Warning saying the gang cannot fit even idle", e.Type, e.Note)
	}
	h.claim("late", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("late", true, "late")
	h.waitUngated("late")
	for i := range 3 {
		if gateIndex(h.getPod(fmt.Sprintf("g%d", i))) < 0 {
			t.Errorf("pod g%d of a gang that cannot fit was ungated", i)
		}
	}
}

// TestPodGroupGang: pods naming a PodGroup (spec.schedulingGroup) with a
// gang policy of minCount 2 and a topology key are placed together in one
// leaf; a pod claim created for the PodGroup itself (PodGroup-level
// claims) gets a clear event.
func TestPodGroupGang(t *testing.T) {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: ns},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: gang.LabelLeaf}}},
		}}
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{PodGroups: true}}
	h := newHarnessWith(t, cfg, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l2"), leafNode(t, "c", "l2"), []runtime.Object{pg})...).start()
	for i := range 2 {
		name := fmt.Sprintf("m%d", i)
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
				SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To("pg")},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}}
		if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.waitUngated("m0")
	h.waitUngated("m1")
	if n := h.allocatedNodes("m0", "m1"); !samePair(n["m0"], n["m1"], "b", "c") {
		t.Errorf("PodGroup gang on %v, want b and c (leaf l2, the only leaf with room for both)", n)
	}
	e := h.waitEvent(ns+"/m0", report.ReasonGangPlaced)
	if !contains(e.Note, "PodGroup pg") {
		t.Errorf("placed event %q, want it to name PodGroup pg", e.Note)
	}

	// A gpulink claim owned by the PodGroup, used by a pod of it.
	shared := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pg-shared", Namespace: ns, UID: uuid.NewUUID(),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "scheduling.k8s.io/v1beta1", Kind: "PodGroup", Name: "pg", UID: uuid.NewUUID(), Controller: ptr.To(true)}}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
	if _, err := h.client.ResourceV1().ResourceClaims(ns).Create(h.ctx, shared, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "m2", Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
			SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To("pg")},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "shared", ResourceClaimTemplateName: ptr.To("t")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "shared", ResourceClaimName: ptr.To("pg-shared")}}}}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e = h.waitEvent(ns+"/m2", report.ReasonUninterpretable)
	if !contains(e.Note, "PodGroup-level ResourceClaim") {
		t.Errorf("event %q, want it to refuse the PodGroup-level claim", e.Note)
	}
}
