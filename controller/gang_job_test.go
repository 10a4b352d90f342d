package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// TestBasicPodGroupYieldsToLabels: with WorkloadWithJob, Kubernetes 1.37's
// Job controller puts the pods of a Job without spec.scheduling in a
// PodGroup with the basic policy. Pods of such a Job whose template has
// gang labels are still one gang: the first waits holding nothing, and
// both are placed together once the second exists.
func TestBasicPodGroupYieldsToLabels(t *testing.T) {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "job-pg", Namespace: ns},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}}}
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{PodGroups: true}}
	h := newHarnessWith(t, cfg, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"), []runtime.Object{pg})...).start()
	inJob := func(name string) {
		p := h.newGangPod(name, "train", 2, 4, nil)
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("job-pg")}
		h.createGangPod(p)
	}
	inJob("p0")
	e := h.waitEventWith(ns+"/p0", report.ReasonGangWaiting, "gang train: 1 of 2 pods")
	h.settle()
	if n := allocatedNode(h.getClaim("p0")); n != "" || gateIndex(h.getPod("p0")) < 0 {
		t.Fatalf("lone pod of a labelled Job in a basic PodGroup allocated on %q or ungated (event %q): placed one by one", n, e.Note)
	}
	inJob("p1")
	h.waitUngated("p0")
	h.waitUngated("p1")
	e = h.waitEvent(ns+"/p1", report.ReasonGangPlaced)
	if !contains(e.Note, "gang train") {
		t.Errorf("placed event %q, want it to name the label gang train", e.Note)
	}
}

// TestGangNameFromLabel: pods of one shared template (a LeaderWorkerSet's)
// name their gang through gangs.LabelNameFrom and the group key their
// controller labels each group with: two groups are two gangs, each
// placed when its own pods exist.
func TestGangNameFromLabel(t *testing.T) {
	const groupKey = "leaderworkerset.sigs.k8s.io/group-key"
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"), leafNode(t, "c", "l2"), leafNode(t, "d", "l2"))...).start()
	member := func(name, group string) {
		p := h.newGangPod(name, "", 2, 4, map[string]string{groupKey: group})
		delete(p.Labels, gangs.LabelGang)
		p.Annotations = map[string]string{gangs.LabelNameFrom: groupKey}
		h.createGangPod(p)
	}
	member("g0-0", "k0")
	member("g1-0", "k1")
	h.waitEventWith(ns+"/g0-0", report.ReasonGangWaiting, "gang k0: 1 of 2 pods")
	h.waitEventWith(ns+"/g1-0", report.ReasonGangWaiting, "gang k1: 1 of 2 pods")
	member("g0-1", "k0")
	h.waitUngated("g0-0")
	h.waitUngated("g0-1")
	h.settle()
	if n := allocatedNode(h.getClaim("g1-0")); n != "" || gateIndex(h.getPod("g1-0")) < 0 {
		t.Fatalf("pod of group k1 allocated on %q or ungated with its group incomplete", n)
	}
	member("g1-1", "k1")
	h.waitUngated("g1-0")
	h.waitUngated("g1-1")
}

// TestBasicPodGroupPodsOneByOne: the pods of a Job without gang labels in
// the Job controller's basic PodGroup are placed as pods outside gangs
// are. Three of them exist before the controller starts, with room for
// one: the other two each wait with their own WaitingForGPUs event (as one
// "gang" evaluated once, only one of them would), and each is placed when
// room appears.
func TestBasicPodGroupPodsOneByOne(t *testing.T) {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "job-pg", Namespace: ns},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}}}
	extra := []runtime.Object{pg}
	pods := []string{"p0", "p1", "p2"}
	for _, name := range pods {
		extra = append(extra, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}}}})
		extra = append(extra, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
				SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To("job-pg")},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}})
	}
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{PodGroups: true}}
	h := newHarnessWith(t, cfg, objs(classes(), leafNode(t, "a", "l1"), extra)...).start()
	var waiting []string
	h.eventually("a WaitingForGPUs event on each of the two pods that do not fit", func() bool {
		waiting = nil
		for _, p := range pods {
			if _, ok := h.rec.find(ns+"/"+p, report.ReasonWaiting); ok {
				waiting = append(waiting, p)
			}
		}
		return len(waiting) == 2
	})
	// Room for both: each is retried and placed.
	h.addLeafNodes("l1", "b", "c")
	for _, p := range pods {
		h.waitUngated(p)
	}
}

// addLeafNodes creates 4-GPU nodes (leafNode) with their slices on the
// running harness.
func (h *harness) addLeafNodes(leaf string, names ...string) {
	h.t.Helper()
	for _, n := range names {
		for _, o := range leafNode(h.t, n, leaf) {
			var err error
			switch o := o.(type) {
			case *corev1.Node:
				_, err = h.client.CoreV1().Nodes().Create(h.ctx, o, metav1.CreateOptions{})
			case *resourceapi.ResourceSlice:
				_, err = h.client.ResourceV1().ResourceSlices().Create(h.ctx, o, metav1.CreateOptions{})
			}
			if err != nil {
				h.t.Fatal(err)
			}
		}
	}
}
