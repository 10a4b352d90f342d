package report

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
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
	got := Gangs(pods, claims, labels, gang.DefaultHierarchy())
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
