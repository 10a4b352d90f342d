package gangs

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/driver/gang"
)

// The examples of demo/batch for JobSet and LeaderWorkerSet cannot be run:
// their controllers' modules (sigs.k8s.io/jobset, sigs.k8s.io/lws) are not
// served by the module proxy gpulink is built with, so neither their Go
// types nor their CRD schemas are at hand. The types below mirror the
// parts of their published APIs the examples use (JobSet
// jobset.x-k8s.io/v1alpha2 api/jobset/v1alpha2/jobset_types.go,
// LeaderWorkerSet leaderworkerset.x-k8s.io/v1
// api/leaderworkerset/v1/leaderworkerset_types.go), field for field, so
// that a strict decode catches a misspelt or misplaced field; the pod
// templates inside are Kubernetes' own types.

type jobSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ReplicatedJobs []struct {
			Name     string                  `json:"name"`
			Replicas *int32                  `json:"replicas,omitempty"`
			Template batchv1.JobTemplateSpec `json:"template"`
		} `json:"replicatedJobs"`
		Network *struct {
			EnableDNSHostnames *bool  `json:"enableDNSHostnames,omitempty"`
			Subdomain          string `json:"subdomain,omitempty"`
		} `json:"network,omitempty"`
		FailurePolicy *struct {
			MaxRestarts int32 `json:"maxRestarts,omitempty"`
		} `json:"failurePolicy,omitempty"`
	} `json:"spec"`
}

type leaderWorkerSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Replicas             *int32 `json:"replicas,omitempty"`
		StartupPolicy        string `json:"startupPolicy,omitempty"`
		LeaderWorkerTemplate struct {
			LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate,omitempty"`
			WorkerTemplate corev1.PodTemplateSpec  `json:"workerTemplate"`
			Size           *int32                  `json:"size,omitempty"`
			RestartPolicy  string                  `json:"restartPolicy,omitempty"`
		} `json:"leaderWorkerTemplate"`
	} `json:"spec"`
}

// Labels the controllers set on the pods they create (their API's
// constants), and the Job controller's (k8s.io/api/batch/v1).
const (
	jobSetNameKey  = "jobset.sigs.k8s.io/jobset-name"
	jobSetIndexKey = "jobset.sigs.k8s.io/job-index"
	lwsNameKey     = "leaderworkerset.sigs.k8s.io/name"
	lwsGroupKey    = "leaderworkerset.sigs.k8s.io/group-key"
)

// readDocs decodes each document of a demo/batch file strictly into the
// value its kind selects.
func readDocs(t *testing.T, file string, into func(kind string) any) {
	t.Helper()
	data, err := os.ReadFile("../../demo/batch/" + file)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		v := into(meta.Kind)
		if v == nil {
			t.Fatalf("%s: unexpected kind %q", file, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
			t.Fatalf("%s: %s: %v", file, meta.Kind, err)
		}
	}
}

// checkTemplate checks a pod template the way the API server and gpulink
// see it: label values valid, every container claim declared, and the
// pod's claim taken from the two-gpus template of gpulink's DeviceClass.
func checkTemplate(t *testing.T, what string, tpl corev1.PodTemplateSpec, claimTemplate *resourceapi.ResourceClaimTemplate) {
	t.Helper()
	for k, v := range tpl.Labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: label %s=%s: %v", what, k, v, errs)
		}
	}
	var declared []string
	for _, c := range tpl.Spec.ResourceClaims {
		declared = append(declared, c.Name)
		if c.ResourceClaimTemplateName == nil || *c.ResourceClaimTemplateName != claimTemplate.Name {
			t.Errorf("%s: claim %s not from template %s: each pod of a gang needs its own claim", what, c.Name, claimTemplate.Name)
		}
	}
	for _, c := range tpl.Spec.Containers {
		for _, rc := range c.Resources.Claims {
			if !slices.Contains(declared, rc.Name) {
				t.Errorf("%s: container %s uses claim %s, which the pod does not declare", what, c.Name, rc.Name)
			}
		}
	}
	if len(declared) == 0 {
		t.Errorf("%s: no resource claims", what)
	}
}

// podFrom is a pod as a controller creates it from a template, with the
// labels it adds.
func podFrom(ns, name string, tpl corev1.PodTemplateSpec, labels map[string]string) *corev1.Pod {
	l := map[string]string{}
	for k, v := range tpl.Labels {
		l[k] = v
	}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l, Annotations: tpl.Annotations}, Spec: tpl.Spec}
}

// gangOfPods groups pods by their gang and checks each gang's spec.
func gangOfPods(t *testing.T, pods []*corev1.Pod) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range pods {
		ref, ok := RefOf(p, true)
		if !ok {
			t.Fatalf("pod %s is in no gang", p.Name)
		}
		s, err := FromLabels(ref, p)
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if s.Level != "leaf" || s.Policy != Required {
			t.Errorf("pod %s: gang %s level %q %s, want leaf Required", p.Name, s.Name, s.Level, s.Policy)
		}
		key := fmt.Sprintf("%s/%d", ref.Name, s.MinCount)
		out[key] = append(out[key], p.Name)
	}
	return out
}

func claimTemplate(t *testing.T) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	var tpl *resourceapi.ResourceClaimTemplate
	readDocs(t, "two-gpus.yaml", func(kind string) any {
		switch kind {
		case "Namespace":
			return &corev1.Namespace{}
		case "ResourceClaimTemplate":
			tpl = &resourceapi.ResourceClaimTemplate{}
			return tpl
		}
		return nil
	})
	if tpl == nil || len(tpl.Spec.Spec.Devices.Requests) != 1 {
		t.Fatalf("two-gpus.yaml: template %+v, want one request", tpl)
	}
	if r := tpl.Spec.Spec.Devices.Requests[0].Exactly; r == nil || r.DeviceClassName != "gpu.gpulink.dev" || r.Count != 2 {
		t.Fatalf("two-gpus.yaml: request %+v, want 2 devices of gpu.gpulink.dev", r)
	}
	return tpl
}

// TestBatchDemoJobs: the Indexed Jobs of demo/batch are one gang of 4 at
// the leaf level, through the labels and through the PodGroup the Job
// controller compiles from spec.scheduling (minCount = parallelism when
// unset, the topology key as a Required level).
func TestBatchDemoJobs(t *testing.T) {
	ct := claimTemplate(t)
	for _, file := range []string{"indexed-job.yaml", "indexed-job-workload.yaml"} {
		t.Run(file, func(t *testing.T) {
			var job *batchv1.Job
			readDocs(t, file, func(kind string) any {
				switch kind {
				case "Service":
					return &corev1.Service{}
				case "Job":
					job = &batchv1.Job{}
					return job
				}
				return nil
			})
			if job == nil || job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion ||
				*job.Spec.Parallelism != 4 || *job.Spec.Completions != 4 {
				t.Fatalf("want an Indexed Job with completions = parallelism = 4: %+v", job)
			}
			checkTemplate(t, file, job.Spec.Template, ct)
			pod := podFrom(job.Namespace, job.Name+"-0", job.Spec.Template, map[string]string{batchv1.JobNameLabel: job.Name})
			var s Spec
			var err error
			if sc := job.Spec.Scheduling; sc != nil {
				// What the Job controller compiles (KEP-5547): a gang
				// PodGroup of minCount parallelism, the Job's key.
				if sc.SchedulingPolicy == nil || sc.SchedulingPolicy.Gang == nil || sc.SchedulingConstraints == nil || len(sc.SchedulingConstraints.Topology) != 1 {
					t.Fatalf("spec.scheduling %+v: want a gang with one topology key", sc)
				}
				minCount := *job.Spec.Parallelism
				if m := sc.SchedulingPolicy.Gang.MinCount; m != nil {
					minCount = *m
				}
				pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: job.Name + "-pg"}}
				pg.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}
				pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: sc.SchedulingConstraints.Topology[0].Key}}}
				pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &pg.Name}
				ref, _ := RefOf(pod, true)
				s, _, err = FromPodGroup(ref, pg, pod)
				if s.Level != gang.LabelLeaf {
					t.Errorf("level %q, want %s", s.Level, gang.LabelLeaf)
				}
			} else {
				ref, ok := RefOf(pod, true)
				if !ok {
					t.Fatal("the Job's pods are in no gang")
				}
				s, err = FromLabels(ref, pod)
				if s.Level != "leaf" {
					t.Errorf("level %q, want leaf", s.Level)
				}
			}
			if err != nil || s.MinCount != 4 || s.Policy != Required {
				t.Errorf("gang %+v (err %v), want 4 pods Required at the leaf", s, err)
			}
		})
	}
}

// TestBatchDemoJobSet: the JobSet example's pods, as the JobSet and Job
// controllers would create them (2 child Jobs × 2 pods, each labelled with
// the JobSet's name), are one gang of 4: the whole training run.
func TestBatchDemoJobSet(t *testing.T) {
	ct := claimTemplate(t)
	var js jobSet
	readDocs(t, "jobset.yaml", func(kind string) any {
		if kind == "JobSet" {
			return &js
		}
		return nil
	})
	if js.APIVersion != "jobset.x-k8s.io/v1alpha2" {
		t.Errorf("apiVersion %s", js.APIVersion)
	}
	var pods []*corev1.Pod
	for _, rj := range js.Spec.ReplicatedJobs {
		checkTemplate(t, "replicatedJob "+rj.Name, rj.Template.Spec.Template, ct)
		for j := range *rj.Replicas {
			jobName := fmt.Sprintf("%s-%s-%d", js.Name, rj.Name, j)
			for i := range *rj.Template.Spec.Parallelism {
				pods = append(pods, podFrom(js.Namespace, fmt.Sprintf("%s-%d", jobName, i), rj.Template.Spec.Template, map[string]string{
					jobSetNameKey: js.Name, jobSetIndexKey: fmt.Sprint(j), batchv1.JobNameLabel: jobName,
				}))
			}
		}
	}
	got := gangOfPods(t, pods)
	if len(got) != 1 || len(got[js.Name+"/4"]) != 4 {
		t.Errorf("gangs %v, want one gang %s of minCount 4 with all 4 pods", got, js.Name)
	}
}

// TestBatchDemoLeaderWorkerSet: the LeaderWorkerSet example's pods, as LWS
// would create them (2 groups of size 4, every pod of a group labelled
// with the group's key, a SHA-1 of its leader's namespace/name), are one
// gang per group, minCount the group's size.
func TestBatchDemoLeaderWorkerSet(t *testing.T) {
	ct := claimTemplate(t)
	var lws leaderWorkerSet
	readDocs(t, "leaderworkerset.yaml", func(kind string) any {
		if kind == "LeaderWorkerSet" {
			return &lws
		}
		return nil
	})
	if lws.APIVersion != "leaderworkerset.x-k8s.io/v1" {
		t.Errorf("apiVersion %s", lws.APIVersion)
	}
	if lws.Spec.StartupPolicy == "LeaderReady" {
		t.Error("startupPolicy LeaderReady: LWS would wait for the leader, which gpulink keeps gated until the group's workers exist")
	}
	lwt := lws.Spec.LeaderWorkerTemplate
	leader := lwt.WorkerTemplate
	if lwt.LeaderTemplate != nil {
		leader = *lwt.LeaderTemplate
	}
	checkTemplate(t, "leaderTemplate", leader, ct)
	checkTemplate(t, "workerTemplate", lwt.WorkerTemplate, ct)
	size := int(*lwt.Size)
	var pods []*corev1.Pod
	for g := range int(*lws.Spec.Replicas) {
		leaderName := fmt.Sprintf("%s-%d", lws.Name, g)
		sum := sha1.Sum([]byte(lws.Namespace + "/" + leaderName))
		labels := map[string]string{lwsNameKey: lws.Name, lwsGroupKey: hex.EncodeToString(sum[:])}
		pods = append(pods, podFrom(lws.Namespace, leaderName, leader, labels))
		for w := 1; w < size; w++ {
			pods = append(pods, podFrom(lws.Namespace, fmt.Sprintf("%s-%d", leaderName, w), lwt.WorkerTemplate, labels))
		}
	}
	got := gangOfPods(t, pods)
	if len(got) != int(*lws.Spec.Replicas) {
		t.Errorf("gangs %v, want one per group (%d)", got, *lws.Spec.Replicas)
	}
	for key, members := range got {
		if !strings.HasSuffix(key, fmt.Sprintf("/%d", size)) || len(members) != size {
			t.Errorf("gang %s: pods %v, want the group's %d pods with minCount %d", key, members, size, size)
		}
	}
}
