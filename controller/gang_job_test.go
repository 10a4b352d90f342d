package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
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
