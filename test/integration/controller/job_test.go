//go:build integration

package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// The tests of this file run Indexed Jobs through the cluster's own
// kube-controller-manager: its Job controller makes the pods (and, with
// WorkloadWithJob, a Workload and a PodGroup for each Job), its
// resourceclaim controller their claims from a ResourceClaimTemplate, the
// chart's scheduling-gate policy (bound to the test's namespace) gates
// them, and gpulink's controller places each Job as one gang.

// jobCluster is gangCluster with a 2-GPU claim template and the chart's
// scheduling-gate policy for the test's namespace.
func jobCluster(t *testing.T) *env {
	e := gangCluster(t)
	e.template("two", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	e.installPolicy(chartPolicy(t, "scheduling-gate.yaml", e.ns, map[string]any{
		"gate": map[string]any{"enabled": true, "failurePolicy": "Fail", "namespaceSelector": map[string]any{}},
	}))
	probe := e.newPod("probe", false, "two")
	e.poll("scheduling-gate policy in effect", time.Minute, func() bool {
		p, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && gateIndexOf(p) >= 0
	})
	return e
}

func gateIndexOf(p *corev1.Pod) int {
	for i, g := range p.Spec.SchedulingGates {
		if g.Name == driver.SchedulingGate {
			return i
		}
	}
	return -1
}

// indexedJob creates a PyTorch-style Indexed Job of 4 pods (completions =
// parallelism = 4), each with a 2-GPU claim from template "two", one gang
// under one leaf switch: through spec.scheduling (a gang policy and a leaf
// topology constraint, compiled by the Job controller into a PodGroup)
// when workloadAPI is set, else through gpulink's labels in the pod
// template. The Job is deleted after the test.
func (e *env) indexedJob(name string, workloadAPI bool) *batchv1.Job {
	e.t.Helper()
	return e.createJob(e.newIndexedJob(name, workloadAPI))
}

// newIndexedJob is indexedJob's Job, not created yet.
func (e *env) newIndexedJob(name string, workloadAPI bool) *batchv1.Job {
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: batchv1.JobSpec{
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Completions:    ptr.To[int32](4),
			Parallelism:    ptr.To[int32](4),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("two")}},
					Containers: []corev1.Container{{
						Name:    "trainer",
						Image:   "registry.k8s.io/pause:3.10",
						Command: []string{"torchrun"},
						Args:    []string{"--nnodes=4", "--nproc-per-node=2", "--node-rank=$(JOB_COMPLETION_INDEX)", "train.py"},
						Resources: corev1.ResourceRequirements{
							Claims: []corev1.ResourceClaim{{Name: "gpus"}},
						},
					}},
				},
			},
		},
	}
	if workloadAPI {
		job.Spec.Scheduling = &batchv1.JobSchedulingConfiguration{
			// minCount defaults to parallelism.
			SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{}},
			SchedulingConstraints: &schedulingv1alpha3.WorkloadPodGroupSchedulingConstraints{
				Topology: []schedulingv1alpha3.TopologyConstraint{{Key: gang.LabelLeaf}},
			},
		}
	} else {
		job.Spec.Template.Labels = map[string]string{
			gangs.LabelGang:  name,
			gangs.LabelSize:  "4",
			gangs.LabelLevel: "leaf",
		}
	}
	return job
}

// createJob creates the Job and deletes it after the test.
func (e *env) createJob(job *batchv1.Job) *batchv1.Job {
	e.t.Helper()
	out, err := e.client.BatchV1().Jobs(e.ns).Create(e.ctx, job, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating Job %s: %v", job.Name, err)
	}
	e.t.Cleanup(func() {
		// Before the namespace's teardown, so that the Job controller
		// makes no new pods while the pods are deleted.
		_ = e.client.BatchV1().Jobs(e.ns).Delete(context.Background(), job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	return out
}

// jobPods waits until the Job controller has made n pods of the Job and
// returns them.
func (e *env) jobPods(job string, n int) []corev1.Pod {
	e.t.Helper()
	var pods []corev1.Pod
	e.poll(fmt.Sprintf("%d pods of Job %s", n, job), 2*time.Minute, func() bool {
		l, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil {
			return false
		}
		pods = l.Items
		return len(pods) == n
	})
	return pods
}

func names(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// ungatingWatch watches the Job's pods from before they exist and, when
// the first of them is seen without gpulink's gate, counts how many of
// the Job's claims are allocated at that moment: a gang's claims are all
// written before any of its pods is ungated.
func (e *env) ungatingWatch(job string) <-chan int {
	e.t.Helper()
	w, err := e.client.CoreV1().Pods(e.ns).Watch(e.ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(chan int, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || gateIndexOf(p) >= 0 {
				continue
			}
			claims, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
			if err != nil {
				return
			}
			n := 0
			for _, c := range claims.Items {
				for _, o := range c.OwnerReferences {
					if o.Kind == "Pod" && strings.HasPrefix(o.Name, job+"-") && c.Status.Allocation != nil {
						n++
					}
				}
			}
			out <- n
			return
		}
	}()
	return out
}

// checkOneGang waits until the Job's 4 pods are bound and checks that they
// were placed as one gang: every claim allocated before the first pod was
// ungated, all pods in leaf l2 (l1 has room for 2 of them only) and a
// GangPlaced event on each.
func (e *env) checkOneGang(t *testing.T, job string, ungated <-chan int) []corev1.Pod {
	e.t.Helper()
	pods := e.jobPods(job, 4)
	nodes := e.boundNodes(names(pods), 2*time.Minute)
	select {
	case n := <-ungated:
		if n != 4 {
			e.t.Errorf("%d of the Job's 4 claims allocated when its first pod was ungated, want all 4: placed one by one", n)
		}
	case <-time.After(30 * time.Second):
		e.t.Error("the watch saw no pod of the Job ungated")
	}
	for i, n := range nodes {
		if l := e.leafOf(t, n); l != "l2" {
			e.t.Errorf("pod %s on %s (leaf %s), want every pod in leaf l2: %v", pods[i].Name, n, l, nodes)
		}
	}
	for _, p := range pods {
		e.waitEvent(p.Name, "GangPlaced", 30*time.Second)
	}
	e.t.Logf("Job %s: pods %v on %v", job, names(pods), nodes)
	return pods
}

// TestJobGangWorkloadAPI: an Indexed Job whose spec.scheduling asks for a
// gang under one leaf (WorkloadWithJob): the Job controller creates its
// Workload and a PodGroup (minCount = parallelism = 4, the leaf as its
// topology key, owned by the Job) and names it in each pod's
// spec.schedulingGroup; gpulink places the 4 pods as that PodGroup's gang
// in the one leaf with room for all of them.
func TestJobGangWorkloadAPI(t *testing.T) {
	if !cluster.WorkloadAPI() {
		t.Skip("the cluster does not serve the Workload API (GPULINK_WORKLOAD_GATES=off): TestJobGangLabels covers Jobs there")
	}
	e := jobCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	e.blocker("block-a1", e.node("a1"))
	e.blocker("block-a2", e.node("a2"))
	ungated := e.ungatingWatch("train-w")
	job := e.indexedJob("train-w", true)
	pods := e.checkOneGang(t, "train-w", ungated)

	pgs, err := e.client.SchedulingV1beta1().PodGroups(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pgs.Items) != 1 {
		t.Fatalf("%d PodGroups in the namespace, want the Job controller's one", len(pgs.Items))
	}
	pg := pgs.Items[0]
	if !metav1.IsControlledBy(&pg, job) {
		t.Errorf("PodGroup %s owners %v, want the Job as its controller", pg.Name, pg.OwnerReferences)
	}
	if g := pg.Spec.SchedulingPolicy.Gang; g == nil || g.MinCount != 4 {
		t.Errorf("PodGroup %s policy %+v, want a gang of minCount 4 (the Job's parallelism)", pg.Name, pg.Spec.SchedulingPolicy)
	}
	if c := pg.Spec.SchedulingConstraints; c == nil || len(c.Topology) != 1 || c.Topology[0].Key != gang.LabelLeaf {
		t.Errorf("PodGroup %s constraints %+v, want topology key %s", pg.Name, c, gang.LabelLeaf)
	}
	for _, p := range pods {
		if g := p.Spec.SchedulingGroup; g == nil || ptr.Deref(g.PodGroupName, "") != pg.Name {
			t.Errorf("pod %s schedulingGroup %+v, want PodGroup %s", p.Name, g, pg.Name)
		}
	}
	if ev := e.waitEvent(pods[0].Name, "GangPlaced", time.Second); !strings.Contains(ev, "PodGroup "+pg.Name) {
		t.Errorf("placed event %q, want it to name PodGroup %s", ev, pg.Name)
	}
	t.Logf("PodGroup %s (Workload %s), minCount 4, key %s", pg.Name, pg.Spec.WorkloadRef.WorkloadName, gang.LabelLeaf)
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestJobGangLabels: an Indexed Job with gpulink's gang labels in its pod
// template and no spec.scheduling. With the Workload API served, the Job
// controller still puts its pods in a PodGroup, of the basic policy: the
// labels make them one gang all the same. Without it
// (GPULINK_WORKLOAD_GATES=off) they name no PodGroup.
func TestJobGangLabels(t *testing.T) {
	e := jobCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	e.blocker("block-a1", e.node("a1"))
	e.blocker("block-a2", e.node("a2"))
	ungated := e.ungatingWatch("train-l")
	e.indexedJob("train-l", false)
	pods := e.checkOneGang(t, "train-l", ungated)
	for _, p := range pods {
		g := p.Spec.SchedulingGroup
		switch {
		case cluster.WorkloadAPI() && g == nil:
			t.Errorf("pod %s names no PodGroup: the Job controller (WorkloadWithJob) names a basic one", p.Name)
		case !cluster.WorkloadAPI() && g != nil:
			t.Errorf("pod %s names PodGroup %v on a cluster without the Workload API", p.Name, g)
		}
	}
	if cluster.WorkloadAPI() {
		pg, err := e.client.SchedulingV1beta1().PodGroups(e.ns).Get(e.ctx, ptr.Deref(pods[0].Spec.SchedulingGroup.PodGroupName, ""), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pg.Spec.SchedulingPolicy.Basic == nil {
			t.Errorf("PodGroup %s policy %+v, want basic (the Job has no spec.scheduling)", pg.Name, pg.Spec.SchedulingPolicy)
		}
		t.Logf("pods name basic PodGroup %s; placed as gang train-l", pg.Name)
	}
	if ev := e.waitEvent(pods[0].Name, "GangPlaced", time.Second); !strings.Contains(ev, "gang train-l") {
		t.Errorf("placed event %q, want it to name gang train-l", ev)
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestJobGangDoesNotFit: an Indexed Job of 4 pods × 2 GPUs under one leaf
// when only 3 such pods fit in any leaf (through the Workload API where
// served, else the labels): no pod of it is ungated and no claim
// allocated, each pod says why; once a blocker ends, all 4 run together.
func TestJobGangDoesNotFit(t *testing.T) {
	e := jobCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	for _, n := range []string{"a1", "a2", "a3", "b1", "b2"} {
		e.blocker("block-"+n, e.node(n))
	}
	// b3 keeps 2 GPUs free, b4 all 4: room for 3 pods in l2, none in l1.
	half := e.newPod("block-b3", true, "two")
	half.Spec.NodeSelector = map[string]string{corev1.LabelHostname: e.node("b3")}
	e.startBound(half, time.Minute)

	workloadAPI := cluster.WorkloadAPI()
	e.indexedJob("train-x", workloadAPI)
	pods := e.jobPods("train-x", 4)
	var ev string
	for _, p := range pods {
		ev = e.waitEvent(p.Name, "only 3 fit in one leaf", 2*time.Minute)
	}
	t.Logf("the Job waits (Workload API %v): %s", workloadAPI, ev)
	for _, name := range names(pods) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if gateIndexOf(p) < 0 || p.Spec.NodeName != "" {
			t.Errorf("pod %s ungated or bound (node %q) while its gang does not fit", name, p.Spec.NodeName)
		}
	}
	if n := e.allocatedCount(names(pods)); n != 0 {
		t.Fatalf("%d claims of the waiting Job allocated: a gang holds nothing while it waits", n)
	}
	e.deletePod("block-b3")
	nodes := e.boundNodes(names(pods), 2*time.Minute)
	for _, n := range nodes {
		if l := e.leafOf(t, n); l != "l2" {
			t.Errorf("Job pod on %s (leaf %s), want leaf l2: %v", n, l, nodes)
		}
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestJobGangSuspended: a Job created suspended and resumed later, as
// Kueue does on admission, is still one gang. The Job controller creates a
// Job's Workload and PodGroup only while the Job has never started
// (isNewJob in pkg/controller/job/job_scheduling_manager.go, which counts
// the Suspended condition as started); its first sync does so before it
// adds that condition, so the PodGroup exists before the Job is resumed.
// Through the Workload API where served, else the labels.
func TestJobGangSuspended(t *testing.T) {
	e := jobCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	e.blocker("block-a1", e.node("a1"))
	e.blocker("block-a2", e.node("a2"))
	workloadAPI := cluster.WorkloadAPI()
	job := e.newIndexedJob("train-s", workloadAPI)
	job.Spec.Suspend = ptr.To(true)
	e.createJob(job)
	e.poll("Job train-s suspended", time.Minute, func() bool {
		j, err := e.client.BatchV1().Jobs(e.ns).Get(e.ctx, "train-s", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobSuspended && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if workloadAPI {
		pgs, err := e.client.SchedulingV1beta1().PodGroups(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pgs.Items) != 1 {
			t.Fatalf("%d PodGroups for the suspended Job, want the Job controller's one", len(pgs.Items))
		}
	}
	ungated := e.ungatingWatch("train-s")
	patch := []byte(`{"spec":{"suspend":false}}`)
	if _, err := e.client.BatchV1().Jobs(e.ns).Patch(e.ctx, "train-s", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := e.checkOneGang(t, "train-s", ungated)
	if workloadAPI {
		for _, p := range pods {
			if p.Spec.SchedulingGroup == nil {
				t.Errorf("pod %s of the resumed Job names no PodGroup", p.Name)
			}
		}
	}
}
