package cli

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestInspectGangs: a gang of two pods, one placed through demoCluster's
// claim train on node-a, one through its own claim on node-b, both of leaf-1, is listed
// after the nodes with its placement and level, in the table and in JSON.
func TestInspectGangs(t *testing.T) {
	node := func(name, leaf string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{gang.LabelLeaf: leaf}}}
	}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(name),
			Labels: map[string]string{gangs.LabelGang: "train", gangs.LabelSize: "2"}}}
	}
	objs := append(demoCluster(t), node("node-a", "leaf-1"), node("node-b", "leaf-1"), pod("train-0"), pod("train-1"),
		heldClaim("team-a", "train-1", []string{"train-1"}, wholeGPU("node-b", "gpu-0")))
	newClient, _ := fakeClient(objs...)
	stdout, _, err := runInspectCmd(t, newClient)
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(stdout, "GANGS\n")
	if !ok {
		t.Fatalf("no GANGS section in:\n%s", stdout)
	}
	fields := strings.Fields(strings.Split(table, "\n")[1])
	want := []string{"team-a", "train", "labels", "2", "(min", "2)", "2", "2", "leaf", "leaf-1"}
	if strings.Join(fields, " ") != strings.Join(want, " ") {
		t.Errorf("gang row %q, want %q", fields, want)
	}
	stdout, _, err = runInspectCmd(t, newClient, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, `"level": "leaf"`) || !strings.Contains(stdout, `"domain": "leaf-1"`) {
		t.Errorf("JSON lacks the gang's level and domain:\n%s", stdout)
	}
}

// TestInspectGangsSkipsBasicPodGroups: the pods of a Job that the Job
// controller put in a PodGroup of the basic policy (WorkloadWithJob) are
// not listed as a gang.
func TestInspectGangsSkipsBasicPodGroups(t *testing.T) {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "job-pg"},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "job-0", UID: "job-0"},
		Spec: corev1.PodSpec{SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To("job-pg")}}}
	newClient, _ := fakeClient(append(demoCluster(t), pg, pod)...)
	stdout, _, err := runInspectCmd(t, newClient)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stdout, "GANGS") {
		t.Errorf("a basic PodGroup's pods listed as a gang:\n%s", stdout)
	}
}
