//go:build e2e

package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
)

// kueueAdmissionGate is the scheduling gate Kueue's pod webhook puts on a
// plain pod until Kueue admits it.
const kueueAdmissionGate = "kueue.x-k8s.io/admission"

// plainPodsQuota: Kueue's plain-pod integration and gpulink's translating
// webhook act on the same pod. The API server calls the mutating webhooks
// in the order of their configurations' names: gpulink's (gpulink-compat)
// turns nvidia.com/gpu: 2 into a claim and adds its gate, then Kueue's
// (kueue-mutating-webhook-configuration) adds its own gate. Kueue makes
// the pod's Workload from the stored pod, so it sees the claim, not
// nvidia.com/gpu: the DeviceClass mapping (gpu.gpulink.dev counted as
// nvidia.com/gpu) is what keeps the quota counting. team-d's quota is 2: the
// first pod is admitted and placed; the second waits for quota behind
// Kueue's gate, and gpulink gives it no GPUs meanwhile, saying why.
func (s *kueueSuite) plainPodsQuota(ctx context.Context, t *testing.T) {
	const team = "team-d"
	s.namespace(ctx, t, team)
	s.applyKueue(ctx, t, teamQueues(team, 2))

	first := s.plainPod(ctx, t, team, "pod-a")
	if !hasGate(first, kueueAdmissionGate) || !hasGate(first, driver.SchedulingGate) || first.Labels[compat.LabelManaged] != "true" {
		t.Fatalf("pod %s admitted with gates %v and labels %v: want both webhooks' gates and gpulink's translation", first.Name, first.Spec.SchedulingGates, first.Labels)
	}
	if _, ok := first.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; ok {
		t.Errorf("pod %s still asks nvidia.com/gpu after gpulink's webhook", first.Name)
	}
	wl := s.waitWorkload(ctx, t, first, "admitted", 2*time.Minute, is("Admitted", "True"))
	var status struct {
		Admission struct {
			PodSetAssignments []struct {
				ResourceUsage map[string]string `json:"resourceUsage"`
			} `json:"podSetAssignments"`
		} `json:"admission"`
	}
	if err := fromUnstructured(wl, "status", &status); err != nil {
		t.Fatal(err)
	}
	if a := status.Admission.PodSetAssignments; len(a) != 1 || a[0].ResourceUsage["nvidia.com/gpu"] != "2" {
		t.Errorf("Workload of pod %s admitted with %+v, want nvidia.com/gpu 2 (its translated claim, through the DeviceClass mapping)", first.Name, a)
	}
	var placed *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := s.client.CoreV1().Pods(team).Get(ctx, first.Name, metav1.GetOptions{})
		placed = p
		return err == nil && p.Spec.NodeName != "", nil
	}); err != nil {
		t.Fatalf("admitted pod not bound:\n%s", describePod(ctx, s.client, team, first.Name))
	}
	s.checkPairs(ctx, t, []corev1.Pod{*placed})
	s.markReady(ctx, t, []corev1.Pod{*placed})

	second := s.plainPod(ctx, t, team, "pod-b")
	s.waitPendingForQuota(ctx, t, second)
	ev := s.waitPodEvent(ctx, t, team, second.Name, kueueAdmissionGate)
	t.Logf("gpulink on %s: %s", second.Name, ev)
	got, err := s.client.CoreV1().Pods(team).Get(ctx, second.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" || !hasGate(got, kueueAdmissionGate) {
		t.Errorf("pod %s over quota: node %q, gates %v; want it unbound behind Kueue's gate", got.Name, got.Spec.NodeName, got.Spec.SchedulingGates)
	}
	for _, st := range got.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			continue
		}
		c, err := s.client.ResourceV1().ResourceClaims(team).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation != nil {
			t.Errorf("claim %s of pod %s, which Kueue holds over quota, is allocated: GPUs held idle", c.Name, got.Name)
		}
	}
	s.checkClusterQueueGPUs(ctx, t, team, 2, 1, "")
}

// plainPod creates a pod of Kueue's queue asking nvidia.com/gpu: 2 as
// written for the device plugin, and returns it as admitted.
func (s *kueueSuite) plainPod(ctx context.Context, t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{kueueQueueLabel: namespace}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "trainer", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}}}},
		},
	}
	out, err := s.client.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", namespace, name, err)
	}
	return out
}

func hasGate(p *corev1.Pod, name string) bool {
	for _, g := range p.Spec.SchedulingGates {
		if strings.EqualFold(g.Name, name) {
			return true
		}
	}
	return false
}
