//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver"
)

// kueueJob describes an Indexed Job of the Kueue tests.
type kueueJob struct {
	namespace, name, queue string
	pods                   int32
	// template names the ResourceClaimTemplate each pod's claim comes
	// from; gpus, instead, asks for nvidia.com/gpu in the container's
	// limits, as a pod written for the device plugin does.
	template string
	gpus     int64
	// gangLevel makes the pods one gang (gpulink's labels in the pod
	// template: gang = the Job's name, gang-size = pods) Required at that
	// level; "" leaves them singletons.
	gangLevel string
}

// create creates the Job in Kueue's queue. Kueue's webhook suspends it
// until Kueue admits it.
func (j kueueJob) create(ctx context.Context, t *testing.T, s *kueueSuite) *batchv1.Job {
	t.Helper()
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "trainer", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	if j.template != "" {
		tmpl.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(j.template)}}
		tmpl.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpus"}}
	}
	if j.gpus > 0 {
		tmpl.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(j.gpus, resource.DecimalSI)}
	}
	if j.gangLevel != "" {
		tmpl.Labels[gangs.LabelGang] = j.name
		tmpl.Labels[gangs.LabelSize] = strconv.Itoa(int(j.pods))
		tmpl.Labels[gangs.LabelLevel] = j.gangLevel
		tmpl.Labels[gangs.LabelPolicy] = string(gangs.Required)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: j.name, Namespace: j.namespace, Labels: map[string]string{kueueQueueLabel: j.queue}},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To(j.pods),
			Completions:    ptr.To(j.pods),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template:       tmpl,
		},
	}
	out, err := s.client.BatchV1().Jobs(j.namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Job %s/%s: %v", j.namespace, j.name, err)
	}
	if !ptr.Deref(out.Spec.Suspend, false) {
		t.Fatalf("Job %s/%s was created unsuspended: Kueue's webhook did not take it", j.namespace, j.name)
	}
	return out
}

// jobPods returns the live pods of the Job.
func (s *kueueSuite) jobPods(ctx context.Context, t *testing.T, namespace, job string) []corev1.Pod {
	t.Helper()
	list, err := s.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// waitBoundPods waits until the Job has n pods, all bound to nodes.
func (s *kueueSuite) waitBoundPods(ctx context.Context, t *testing.T, namespace, job string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods = s.jobPods(ctx, t, namespace, job)
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		last = fmt.Sprintf("%d pods, %d bound", len(pods), bound)
		return len(pods) == n && bound == n, nil
	})
	if err != nil {
		msg := fmt.Sprintf("Job %s/%s: want %d pods bound, have %s", namespace, job, n, last)
		for _, p := range pods {
			msg += "\n" + describePod(ctx, s.client, namespace, p.Name)
		}
		t.Fatal(msg)
	}
	return pods
}

// markReady sets the pods Running and Ready, as the kubelet of a real node
// would once their containers start: the API-only nodes have none, and
// Kueue's waitForPodsReady counts the Job's ready pods.
func (s *kueueSuite) markReady(ctx context.Context, t *testing.T, pods []corev1.Pod) {
	t.Helper()
	now := metav1.Now()
	for _, p := range pods {
		pod, err := s.client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.StartTime = &now
		for _, c := range []corev1.PodConditionType{corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: "trainer", Image: pod.Spec.Containers[0].Image, ImageID: pod.Spec.Containers[0].Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}}
		if _, err := s.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("marking pod %s/%s ready: %v", p.Namespace, p.Name, err)
		}
	}
}

// workload returns the Kueue Workload of the Job or plain pod (owned by
// it), nil while Kueue has not created it.
func (s *kueueSuite) workload(ctx context.Context, t *testing.T, owner metav1.Object) *unstructured.Unstructured {
	t.Helper()
	list, err := s.dyn.Resource(workloadGVR).Namespace(owner.GetNamespace()).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		for _, o := range list.Items[i].GetOwnerReferences() {
			if o.UID == owner.GetUID() {
				return &list.Items[i]
			}
		}
	}
	return nil
}

// kueueCondition is a condition of a Workload.
type kueueCondition struct {
	Type, Status, Reason, Message string
}

// conditions returns the Workload's conditions by type.
func conditions(wl *unstructured.Unstructured) map[string]kueueCondition {
	out := map[string]kueueCondition{}
	var status struct {
		Conditions []kueueCondition `json:"conditions"`
	}
	if wl == nil || fromUnstructured(wl, "status", &status) != nil {
		return out
	}
	for _, c := range status.Conditions {
		out[c.Type] = c
	}
	return out
}

// waitWorkload waits until the Workload of the Job or plain pod satisfies
// cond and returns it.
func (s *kueueSuite) waitWorkload(ctx context.Context, t *testing.T, owner metav1.Object, what string, timeout time.Duration, cond func(map[string]kueueCondition) bool) *unstructured.Unstructured {
	t.Helper()
	var wl *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		wl = s.workload(ctx, t, owner)
		return wl != nil && cond(conditions(wl)), nil
	})
	if err != nil {
		t.Fatalf("Workload of %s/%s: %s: not within %s (conditions %v)", owner.GetNamespace(), owner.GetName(), what, timeout, conditions(wl))
	}
	return wl
}

// is returns a condition test: the condition of type typ has status.
func is(typ, status string) func(map[string]kueueCondition) bool {
	return func(c map[string]kueueCondition) bool { return c[typ].Status == status }
}

// waitPendingForQuota waits until Kueue keeps the Workload of the Job or
// plain pod in its queue for want of quota.
func (s *kueueSuite) waitPendingForQuota(ctx context.Context, t *testing.T, owner metav1.Object) {
	t.Helper()
	wl := s.waitWorkload(ctx, t, owner, "pending for quota", time.Minute, func(c map[string]kueueCondition) bool {
		q := c["QuotaReserved"]
		return q.Status == "False" && strings.Contains(q.Message, "insufficient")
	})
	t.Logf("%s waits in Kueue's queue: %s", owner.GetName(), conditions(wl)["QuotaReserved"].Message)
}

// checkSuspendedByKueue checks that the Job waits in Kueue's queue: its
// Workload has no quota reserved, the Job is suspended, it has no pods and
// no claims, so gpulink never saw it.
func (s *kueueSuite) checkSuspendedByKueue(ctx context.Context, t *testing.T, job *batchv1.Job) {
	t.Helper()
	s.waitPendingForQuota(ctx, t, job)
	got, err := s.client.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(got.Spec.Suspend, false) {
		t.Errorf("Job %s is not suspended", job.Name)
	}
	if pods := s.jobPods(ctx, t, job.Namespace, job.Name); len(pods) != 0 {
		t.Errorf("Job %s waiting for quota has %d pods", job.Name, len(pods))
	}
	claims, err := s.client.ResourceV1().ResourceClaims(job.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if strings.HasPrefix(c.Name, job.Name+"-") {
			t.Errorf("Job %s waiting for quota has claim %s", job.Name, c.Name)
		}
	}
}

// podClaims returns the allocated claims of a pod (created from its
// templates), failing when one is not allocated on the pod's node.
func (s *kueueSuite) podClaims(ctx context.Context, t *testing.T, p corev1.Pod) []string {
	t.Helper()
	var devices []string
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			t.Fatalf("pod %s: claim %s not created", p.Name, st.Name)
		}
		c, err := s.client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation == nil {
			t.Fatalf("pod %s bound to %s with claim %s unallocated", p.Name, p.Spec.NodeName, c.Name)
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == driver.Name && r.Pool != p.Spec.NodeName {
				t.Errorf("pod %s on %s has device %s of pool %s", p.Name, p.Spec.NodeName, r.Device, r.Pool)
			}
			devices = append(devices, r.Device)
		}
	}
	return devices
}

// checkPairs checks that each pod holds one NVLink-bridged pair of its
// node: the link-minimal choice for 2 GPUs there.
func (s *kueueSuite) checkPairs(ctx context.Context, t *testing.T, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		devs := s.podClaims(ctx, t, p)
		if len(devs) != 2 {
			t.Errorf("pod %s holds devices %v, want 2 GPUs", p.Name, devs)
			continue
		}
		var pos []int
		for _, d := range devs {
			i, err := driver.ParseDeviceName(d)
			if err != nil {
				t.Fatal(err)
			}
			at, ok := s.topo.Position(i)
			if !ok {
				t.Fatalf("device %s not in %s", d, kueueTopologyFixture)
			}
			pos = append(pos, at)
		}
		if link := s.topo.WeakestLink(pos); !link.IsNVLink() {
			t.Errorf("pod %s on %s holds %v joined by %s, want an NVLink pair", p.Name, p.Spec.NodeName, devs, link)
		}
	}
}

// eventsOf returns "reason: note" of the events about a pod.
func (s *kueueSuite) eventsOf(ctx context.Context, namespace, pod string) []string {
	l, err := s.client.EventsV1().Events(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, ev := range l.Items {
		if ev.Regarding.Name == pod {
			out = append(out, ev.Reason+": "+ev.Note)
		}
	}
	return out
}

// waitPodEvent waits for an event on the pod that contains all of subs.
func (s *kueueSuite) waitPodEvent(ctx context.Context, t *testing.T, namespace, pod string, subs ...string) string {
	t.Helper()
	var found string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, ev := range s.eventsOf(ctx, namespace, pod) {
			all := true
			for _, sub := range subs {
				all = all && strings.Contains(ev, sub)
			}
			if all {
				found = ev
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no event %q on pod %s/%s; events: %v", subs, namespace, pod, s.eventsOf(ctx, namespace, pod))
	}
	return found
}
