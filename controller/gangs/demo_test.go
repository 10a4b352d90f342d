package gangs

import (
	"os"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// TestDemoIndexedJobs: the manifests of demo/gangs decode strictly, and
// the pods their Jobs create are one gang of 4 at the leaf level, through
// the labels and through the PodGroup.
func TestDemoIndexedJobs(t *testing.T) {
	for _, tc := range []struct {
		file, source, level string
	}{
		{"indexed-job.yaml", "labels", "leaf"},
		{"indexed-job-podgroup.yaml", "PodGroup", "network.topology.nvidia.com/leaf"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile("../../demo/gangs/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			var job *batchv1.Job
			var pg *schedulingv1beta1.PodGroup
			for _, doc := range strings.Split(string(data), "\n---\n") {
				var meta metav1.TypeMeta
				if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
					t.Fatal(err)
				}
				switch meta.Kind {
				case "Job":
					job = &batchv1.Job{}
					if err := yaml.UnmarshalStrict([]byte(doc), job); err != nil {
						t.Fatalf("Job: %v", err)
					}
				case "PodGroup":
					pg = &schedulingv1beta1.PodGroup{}
					if err := yaml.UnmarshalStrict([]byte(doc), pg); err != nil {
						t.Fatalf("PodGroup: %v", err)
					}
				}
			}
			if job == nil {
				t.Fatal("no Job")
			}
			// Label values are validated as the API server does.
			for k, v := range job.Spec.Template.Labels {
				if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
					t.Errorf("label %s=%s: %v", k, v, errs)
				}
			}
			// A pod as the Job controller creates it from the template.
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: job.Name + "-0", Labels: job.Spec.Template.Labels}, Spec: job.Spec.Template.Spec}
			ref, ok := RefOf(pod, true)
			if !ok || string(ref.Source) != tc.source {
				t.Fatalf("pod's gang %+v (ok %v), want one from %s", ref, ok, tc.source)
			}
			var s Spec
			if ref.Source == SourcePodGroup {
				if pg == nil || pg.Name != ref.Name {
					t.Fatalf("the pods name PodGroup %s, the file has %v", ref.Name, pg)
				}
				s, _, err = FromPodGroup(ref, pg, pod)
			} else {
				s, err = FromLabels(ref, pod)
			}
			if err != nil || s.MinCount != int(*job.Spec.Parallelism) || s.Level != tc.level || s.Policy != Required {
				t.Errorf("gang %+v (err %v), want %d pods Required at the leaf", s, err, *job.Spec.Parallelism)
			}
		})
	}
}
