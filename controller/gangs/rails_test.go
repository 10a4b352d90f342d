package gangs

import (
	"strings"
	"testing"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// gang-rails comes from the pod's label or annotation, else from the
// PodGroup's annotation; the pod's wins; other values are refused.
func TestRails(t *testing.T) {
	ref := Ref{Namespace: "ns", Name: "g", Source: SourceLabels}
	base := map[string]string{LabelGang: "g", LabelSize: "2"}
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		labels, ann map[string]string
		want        bool
		wantErr     string
	}{
		{name: "default per pod", labels: base},
		{name: "label", labels: with(map[string]string{LabelRails: "aligned"}), want: true},
		{name: "annotation", labels: base, ann: map[string]string{LabelRails: "Aligned"}, want: true},
		{name: "per-pod", labels: with(map[string]string{LabelRails: "per-pod"})},
		{name: "invalid", labels: with(map[string]string{LabelRails: "same"}), wantErr: `gang-rails="same": want aligned or per-pod`},
	} {
		s, err := FromLabels(ref, pod(tc.labels, tc.ann, ""))
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.wantErr)
			}
		case err != nil || s.AlignRails != tc.want:
			t.Errorf("%s: AlignRails %v err %v, want %v", tc.name, s.AlignRails, err, tc.want)
		}
	}

	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg", Annotations: map[string]string{LabelRails: "aligned"}}}
	pg.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}
	pgRef := Ref{Namespace: "ns", Name: "pg", Source: SourcePodGroup}
	if s, _, err := FromPodGroup(pgRef, pg, pod(nil, nil, "pg")); err != nil || !s.AlignRails {
		t.Errorf("PodGroup annotation: AlignRails %v err %v, want true", s.AlignRails, err)
	}
	if s, _, err := FromPodGroup(pgRef, pg, pod(map[string]string{LabelRails: "per-pod"}, nil, "pg")); err != nil || s.AlignRails {
		t.Errorf("pod's per-pod over the PodGroup's aligned: AlignRails %v err %v, want false", s.AlignRails, err)
	}
}
