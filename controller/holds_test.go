package controller

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
)

const holdNS = "gpulink-system"

// newHoldHarness is newHarnessWith plus UIDs for created claims, as the API
// server assigns them (the fake clientset does not; the controller creates
// hold records and keys them by UID).
func newHoldHarness(t *testing.T, cfg Config, objects ...runtime.Object) *harness {
	h := newHarnessWith(t, cfg, objects...)
	h.client.PrependReactor("create", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if m, err := meta.Accessor(a.(clienttesting.CreateAction).GetObject()); err == nil && m.GetUID() == "" {
			m.SetUID(uuid.NewUUID())
		}
		return false, nil, nil
	})
	return h
}

// bindRunning does what kube-scheduler and the kubelet would: reserves the
// pod's claims (PreBind), binds the pod to node and marks it Running.
func (h *harness) bindRunning(name, node string) {
	h.t.Helper()
	h.reserve(h.getPod(name))
	p := h.bind(name, node)
	p.Status.Phase = corev1.PodRunning
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// bind binds the pod to node, as kube-scheduler's binding does, and
// nothing else (no reservation, no phase).
func (h *harness) bind(name, node string) *corev1.Pod {
	h.t.Helper()
	p := h.getPod(name)
	p.Spec.NodeName = node
	p, err := h.client.CoreV1().Pods(ns).Update(h.ctx, p, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatalf("binding pod %s to %s: %v", name, node, err)
	}
	return p
}

// deallocate clears a claim's allocation and reservations, as
// kube-scheduler's DRA plugin does for a pod it refused.
func (h *harness) deallocate(name string) {
	h.t.Helper()
	c := h.getClaim(name)
	c.Status.ReservedFor, c.Status.Allocation = nil, nil
	if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		h.t.Fatalf("deallocating claim %s: %v", name, err)
	}
}

// reserve adds the pod to reservedFor of each of its claims, as
// kube-scheduler's PreBind does (against the resourceVersion read).
func (h *harness) reserve(p *corev1.Pod) {
	h.t.Helper()
	for _, pc := range p.Spec.ResourceClaims {
		if pc.ResourceClaimName == nil {
			continue
		}
		c := h.getClaim(*pc.ResourceClaimName)
		if slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }) {
			continue
		}
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
		if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
			h.t.Fatalf("reserving claim %s for pod %s: %v", c.Name, p.Name, err)
		}
	}
}

// deleteClaim deletes a claim as its owner can once gpulink's finalizer is
// gone (the fake clientset ignores finalizers).
func (h *harness) deleteClaim(name string) {
	h.t.Helper()
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) holdRecords() []resourceapi.ResourceClaim {
	h.t.Helper()
	l, err := h.client.ResourceV1().ResourceClaims(holdNS).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return l.Items
}

// restart stops the controller and starts a fresh one on the same client:
// nothing survives but what the API holds.
func (h *harness) restart(cfg Config) {
	h.t.Helper()
	h.stop()
	_, ctx := ktesting.NewTestContext(h.t)
	h.ctx, h.cancel = context.WithCancel(ctx)
	h.done = make(chan struct{})
	cfg.Client, cfg.Recorder = h.client, h.rec
	ctrl, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.ctrl = ctrl
	h.start()
}

// waitDecided waits until the controller decided pod's claim and fails the
// test if it was allocated: held are GPUs a running pod still uses.
func (h *harness) waitDecided(pod, claim string, held []string) {
	h.t.Helper()
	var c *resourceapi.ResourceClaim
	h.eventually("pod "+pod+" decided", func() bool {
		c = h.getClaim(claim)
		_, waiting := h.rec.find(ns+"/"+pod, report.ReasonWaiting)
		return waiting || c.Status.Allocation != nil
	})
	if c.Status.Allocation != nil {
		h.t.Fatalf("claim %s got %v while a running pod still uses %v", claim, devicesOf(c), held)
	}
}

func (h *harness) countEvents(object, reason string) int {
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	n := 0
	for _, e := range h.rec.events {
		if e.Object == object && e.Reason == reason {
			n++
		}
	}
	return n
}

// A claim deleted (its finalizer removed by its owner) while its pod runs:
// its whole GPUs and its share stay counted, recorded in the hold
// namespace, across a controller restart, until the pod finishes; then
// the next tenant gets them.
func TestDeletedClaimKeepsGPUsWhilePodRuns(t *testing.T) {
	cfg := Config{Workers: 2, DeviceTaintRules: true, HoldNamespace: holdNS}
	h := newHoldHarness(t, cfg, objs(classes(), gpuNode(t, "n4", "pcie-4.txt"))...).start()
	h.claim("three", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 3)}})
	h.claim("sh", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}})
	h.pod("a", true, "three", "sh")
	three, sh := h.waitAllocated("three"), h.waitAllocated("sh")
	h.waitUngated("a")
	h.bindRunning("a", "n4")
	held := append(devicesOf(three), devicesOf(sh)...)

	h.deleteClaim("three")
	h.deleteClaim("sh")
	// The next tenant's GPU must wait: every GPU is held.
	h.claim("next", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.pod("b", true, "next")
	h.waitDecided("b", "next", held)
	if e := h.waitEvent(ns+"/a", report.ReasonClaimDeletedInUse); !contains(e.Note, "stay counted") {
		t.Errorf("event on the pod: %q", e.Note)
	}
	var records []resourceapi.ResourceClaim
	h.eventually("two hold records with their allocation", func() bool {
		records = h.holdRecords()
		return len(records) == 2 && records[0].Status.Allocation != nil && records[1].Status.Allocation != nil
	})
	for _, r := range records {
		var hr holdRecord
		if err := json.Unmarshal([]byte(r.Annotations[HoldAnnotation]), &hr); err != nil {
			t.Fatalf("record %s: %v", r.Name, err)
		}
		want := three
		if hr.ClaimUID == sh.UID {
			want = sh
		}
		if hr.Claim != ns+"/"+want.Name || len(hr.Pods) != 1 || hr.Pods[0].Name != "a" {
			t.Errorf("record %s says %+v", r.Name, hr)
		}
		if !slices.Equal(devicesOf(&r), devicesOf(want)) {
			t.Errorf("record %s holds %v, want %v", r.Name, devicesOf(&r), devicesOf(want))
		}
		for i, res := range r.Status.Allocation.Devices.Results {
			orig := want.Status.Allocation.Devices.Results[i]
			if (res.ShareID == nil) != (orig.ShareID == nil) || (res.ShareID != nil && *res.ShareID != *orig.ShareID) || len(res.ConsumedCapacity) != len(orig.ConsumedCapacity) {
				t.Errorf("record %s result %d: shareID %v consumed %v, want %v %v", r.Name, i, res.ShareID, res.ConsumedCapacity, orig.ShareID, orig.ConsumedCapacity)
			}
		}
	}

	// A restarted controller knows only what the API holds: the records.
	before := h.countEvents(ns+"/b", report.ReasonWaiting)
	h.restart(cfg)
	h.eventually("pod b decided again after the restart", func() bool { return h.countEvents(ns+"/b", report.ReasonWaiting) > before })
	if c := h.getClaim("next"); c.Status.Allocation != nil {
		t.Fatalf("after a restart the next tenant got %v while pod a still uses %v", devicesOf(c), held)
	}

	p := h.getPod("a")
	p.Status.Phase = corev1.PodSucceeded
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := devicesOf(h.waitAllocated("next"))
	if !slices.Contains(held, got[0]) {
		t.Errorf("next tenant got %v, want one of the freed GPUs %v", got, held)
	}
	h.eventually("hold records deleted", func() bool { return len(h.holdRecords()) == 0 })
}

// Without a hold namespace the devices are kept in memory: released when
// the pod is deleted. A pod that is not bound to a node (it never ran)
// keeps nothing.
func TestDeletedClaimKeptInMemoryUntilPodDeleted(t *testing.T) {
	h := newHoldHarness(t, Config{Workers: 2, DeviceTaintRules: true}, objs(classes(), gpuNode(t, "n4", "pcie-4.txt"))...).start()
	h.claim("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("a", true, "four")
	four := h.waitAllocated("four")
	h.waitUngated("a")
	h.bindRunning("a", "n4")
	h.deleteClaim("four")
	h.claim("next", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("b", true, "next")
	h.waitDecided("b", "next", devicesOf(four))
	h.waitEvent(ns+"/a", report.ReasonClaimDeletedInUse)
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitAllocated("next")
	h.waitUngated("b")

	// b is ungated but never bound: deleting its claim frees the GPUs at
	// once for the third tenant.
	h.deleteClaim("next")
	h.claim("third", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("c", true, "third")
	h.waitAllocated("third")
	if n := len(h.holdRecords()); n != 0 {
		t.Errorf("%d hold records without a hold namespace configured", n)
	}
}

// A hold record whose status write was lost (created, then the controller
// stopped) is completed by the next controller, and counted from its
// annotation meanwhile.
func TestHoldRecordCompletedAfterRestart(t *testing.T) {
	cfg := Config{Workers: 2, DeviceTaintRules: true, HoldNamespace: holdNS}
	h := newHoldHarness(t, cfg, objs(classes(), gpuNode(t, "n4", "pcie-4.txt"))...).start()
	h.claim("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("a", true, "four")
	four := h.waitAllocated("four")
	h.waitUngated("a")
	h.bindRunning("a", "n4")
	h.stop()

	// What writeHoldRecord's create leaves before its status update.
	rec := holdRecord{Claim: ns + "/four", ClaimUID: four.UID, Allocation: four.Status.Allocation.DeepCopy(),
		Pods: []heldPod{{Namespace: ns, Name: "a", UID: h.getPod("a").UID}}}
	for i := range rec.Allocation.Devices.Results {
		rec.Allocation.Devices.Results[i].Request = holdRequest
	}
	raw, _ := json.Marshal(rec)
	obj := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: holdNamePrefix + string(four.UID), Namespace: holdNS,
			Labels: map[string]string{HoldLabel: "true"}, Annotations: map[string]string{HoldAnnotation: string(raw)}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: holdRequest,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: holdClass, Count: 4}}}}},
	}
	if _, err := h.client.ResourceV1().ResourceClaims(holdNS).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.ResourceV1().ResourceClaims(ns).Delete(context.Background(), "four", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.restart(cfg)
	h.claim("next", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.pod("b", true, "next")
	h.waitEvent(ns+"/b", report.ReasonWaiting)
	h.eventually("record's allocation written", func() bool {
		r := h.holdRecords()
		return len(r) == 1 && r[0].Status.Allocation != nil && slices.Equal(devicesOf(&r[0]), devicesOf(four))
	})
	if c := h.getClaim("next"); c.Status.Allocation != nil {
		t.Fatalf("next tenant got %v from a recorded hold", devicesOf(c))
	}
	if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitAllocated("next")
	h.eventually("hold record deleted", func() bool { return len(h.holdRecords()) == 0 })
}
