//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

// TestJobGangOnRealNode runs a PyTorch-style Indexed Job (completions =
// parallelism = 4, each pod 2 GPUs from a ResourceClaimTemplate) on the
// local cluster with gpulink as a user deploys it (the built controller
// binary, the chart's scheduling-gate policy) and the cluster's own
// kube-controller-manager. With the Workload API served (the local
// cluster's default, WorkloadWithJob on) the Job's spec.scheduling asks
// for a gang and the Job controller creates its PodGroup; with
// GPULINK_WORKLOAD_GATES=off the pod template's gang labels make it one.
// The 4 pods are pinned to the real node, whose 8 GPUs are 4
// NVLink-bridged pairs: placed as one gang, each pod gets one bridged
// pair, the 4 pairs distinct, and every container runs with its own.
// The deeper gang cases (a leaf, a Job that does not fit) are in
// test/integration/controller/job_test.go.
func TestJobGangOnRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	workloadAPI := os.Getenv("GPULINK_WORKLOAD_GATES") != "off"
	s := setupOpts(ctx, t, setupOptions{workloadGatesOff: !workloadAPI})
	if s.cluster.WorkloadAPI() != workloadAPI {
		t.Fatalf("cluster serves the Workload API: %v, want %v", s.cluster.WorkloadAPI(), workloadAPI)
	}
	s.template(ctx, t, "rank-pair", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 2}, nil)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns},
		Spec: batchv1.JobSpec{
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Completions:    ptr.To[int32](4),
			Parallelism:    ptr.To[int32](4),
			BackoffLimit:   ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					HostNetwork:                   true,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					NodeSelector:                  map[string]string{corev1.LabelHostname: s.realNode},
					ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("rank-pair")}},
					Containers: []corev1.Container{{
						Name:            "workload",
						Image:           localcluster.WorkloadImage,
						ImagePullPolicy: corev1.PullNever,
						Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
						Env:             s.workloadEnv,
					}},
				},
			},
		},
	}
	if workloadAPI {
		job.Spec.Scheduling = &batchv1.JobSchedulingConfiguration{
			SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{}},
		}
	} else {
		job.Spec.Template.Labels = map[string]string{"gpu.gpulink.dev/gang": "train", "gpu.gpulink.dev/gang-size": "4"}
	}
	if _, err := s.client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = s.client.BatchV1().Jobs(ns).Delete(context.Background(), job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	}()

	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, allocTimeout, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		l, err := s.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job.Name})
		if err != nil {
			return false, err
		}
		pods = l.Items
		return len(pods) == 4, nil
	})
	if err != nil {
		t.Fatalf("the Job controller made %d of 4 pods: %v", len(pods), err)
	}
	node := s.nodes(ctx, t)[s.realNode]
	seen := map[string]string{}
	for _, p := range pods {
		// The gang may be placed before the list above sees all 4 pods: a
		// pod without gpulink's gate by then must have been placed with
		// its gang by the controller (its GangPlaced event; the controller
		// decides gated pods only), not been created without the gate.
		if gated(&p) != 1 && !s.podEvent(ctx, t, ns, p.Name, report.ReasonGangPlaced) {
			t.Errorf("pod %s has gates %v and no %s event: the chart's policy did not add gpulink's gate", p.Name, p.Spec.SchedulingGates, report.ReasonGangPlaced)
		}
		if workloadAPI && (p.Spec.SchedulingGroup == nil || p.Spec.SchedulingGroup.PodGroupName == nil) {
			t.Errorf("pod %s names no PodGroup: the Job controller (WorkloadWithJob) names its gang PodGroup", p.Name)
		}
		h := s.waitBoundIn(ctx, t, ns, p.Name)
		weakest, err := node.Weakest(h.Devices)
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Devices) != 2 || !weakest.IsNVLink() {
			t.Errorf("pod %s holds %s linked by %s, want an NVLink-bridged pair", p.Name, gpuview.Indexes(h.Devices), weakest)
		}
		for _, d := range h.Devices {
			if other, dup := seen[d]; dup {
				t.Errorf("device %s given to pods %s and %s", d, other, p.Name)
			}
			seen[d] = p.Name
		}
		s.waitRunning(ctx, t, &h)
		s.checkDevices(t, node, h)
	}
	events, err := s.client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]string{}
	for _, e := range events.Items {
		if e.Reason == "GangPlaced" {
			placed[e.Regarding.Name] = e.Note
		}
	}
	for _, p := range pods {
		if note, ok := placed[p.Name]; !ok {
			t.Errorf("pod %s has no GangPlaced event: not placed as a gang", p.Name)
		} else if !strings.Contains(note, "4 pods placed together") {
			t.Errorf("pod %s: GangPlaced %q, want 4 pods placed together", p.Name, note)
		}
	}
	if workloadAPI {
		pg, err := s.client.SchedulingV1beta1().PodGroups(ns).Get(ctx, *pods[0].Spec.SchedulingGroup.PodGroupName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if g := pg.Spec.SchedulingPolicy.Gang; g == nil || g.MinCount != 4 {
			t.Errorf("PodGroup %s policy %+v, want a gang of 4", pg.Name, pg.Spec.SchedulingPolicy)
		}
		t.Logf("the Job controller's PodGroup %s: gang of %d", pg.Name, pg.Spec.SchedulingPolicy.Gang.MinCount)
	}
}

// podEvent reports whether the pod has an event of the reason, waiting a
// little for it.
func (s *suite) podEvent(ctx context.Context, t *testing.T, namespace, pod, reason string) bool {
	t.Helper()
	selector := fields.Set{"involvedObject.name": pod, "reason": reason}.AsSelector().String()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := s.client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return false, err
		}
		return len(l.Items) > 0, nil
	})
	return err == nil
}
