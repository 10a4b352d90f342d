package report

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestGangs: pods are grouped by gang, placed by spec.nodeName or by the
// node of the gpulink claim reserved for them, and the level is the
// lowest the placed pods share.
func TestGangs(t *testing.T) {
	pod := func(name, node string, labels map[string]string, group string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Labels: labels}, Spec: corev1.PodSpec{NodeName: node}}
		if group != "" {
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group)}
		}
		return p
	}
	lbl := map[string]string{gangs.LabelGang: "train", gangs.LabelSize: "3"}
	gated := pod("t2", "", lbl, "")
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
	pods := []*corev1.Pod{
		pod("t0", "a1", lbl, ""), pod("t1", "", lbl, ""), gated,
		pod("g0", "b1", nil, "pg"), pod("g1", "b2", nil, "pg"),
		pod("single", "a1", nil, ""),
	}
	// t1 is allocated on a2, not bound yet.
	claims := []*resourceapi.ResourceClaim{{
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Driver: driver.Name, Pool: "a2", Device: "gpu-0"}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "t1", UID: "uid-t1"}},
		},
	}}
	labels := map[string]map[string]string{
		"a1": {gang.LabelLeaf: "l1", gang.LabelSpine: "s1"},
		"a2": {gang.LabelLeaf: "l1", gang.LabelSpine: "s1"},
		"b1": {gang.LabelLeaf: "l2", gang.LabelSpine: "s1", gang.LabelClique: "cq"},
		"b2": {gang.LabelLeaf: "l2", gang.LabelSpine: "s1", gang.LabelClique: "cq"},
	}
	got := Gangs(pods, claims, labels, gang.DefaultHierarchy(), nil)
	if len(got) != 2 {
		t.Fatalf("gangs %+v, want pg and train", got)
	}
	pg, train := got[0], got[1]
	if pg.Name != "pg" || pg.Source != "PodGroup" || pg.Placed != 2 || pg.Level != "clique" || pg.Domain != "cq" {
		t.Errorf("PodGroup gang %+v, want 2 placed in clique cq", pg)
	}
	if train.Name != "train" || train.MinCount != 3 || train.Placed != 2 || train.Nodes != 2 || train.Level != "leaf" || train.Domain != "l1" {
		t.Errorf("label gang %+v, want 2 of 3 placed across leaf l1", train)
	}
	if p := train.Pods[2]; p.Name != "t2" || !p.Gated || p.Node != "" {
		t.Errorf("waiting pod %+v, want gated without a node", p)
	}
}

// TestGangsPodGroupPolicy: with the PodGroups at hand, pods of a basic
// PodGroup (every Job's, under WorkloadWithJob) are no gang unless their
// labels make one, and a gang PodGroup gives its minCount.
func TestGangsPodGroupPolicy(t *testing.T) {
	inGroup := func(name, group string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Labels: labels},
			Spec: corev1.PodSpec{SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group)}}}
	}
	groups := map[string]*schedulingv1beta1.PodGroup{
		"basic": {Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}}},
		"gang":  {Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}}}},
	}
	lookup := func(_, name string) (*schedulingv1beta1.PodGroup, bool) {
		pg, ok := groups[name]
		return pg, ok
	}
	lbl := map[string]string{gangs.LabelGang: "train", gangs.LabelSize: "2"}
	pods := []*corev1.Pod{
		inGroup("job-0", "basic", nil), inGroup("job-1", "basic", nil),
		inGroup("train-0", "basic", lbl), inGroup("train-1", "basic", lbl),
		inGroup("g-0", "gang", nil), inGroup("g-1", "gang", nil),
	}
	got := Gangs(pods, nil, nil, gang.DefaultHierarchy(), lookup)
	var rows []string
	for _, g := range got {
		rows = append(rows, fmt.Sprintf("%s/%s/%d/%d", g.Source, g.Name, g.MinCount, len(g.Pods)))
	}
	if want := "PodGroup/gang/2/2 labels/train/2/2"; strings.Join(rows, " ") != want {
		t.Errorf("gangs %v, want %s", rows, want)
	}
}
