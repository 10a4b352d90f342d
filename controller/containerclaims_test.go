package controller

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestContainerClaimGroups(t *testing.T) {
	tmpl := func(name string) corev1.PodResourceClaim {
		tn := "rct-" + name
		return corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: &tn}
	}
	named := func(name string) corev1.PodResourceClaim {
		cn := "shared-" + name
		return corev1.PodResourceClaim{Name: name, ResourceClaimName: &cn}
	}
	ctr := func(refs ...corev1.ResourceClaim) corev1.Container {
		return corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{Claims: refs}}
	}
	ref := func(name string) corev1.ResourceClaim { return corev1.ResourceClaim{Name: name} }
	pod := func(claims []corev1.PodResourceClaim, ctrs ...corev1.Container) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{ResourceClaims: claims, Containers: ctrs}}
		for _, c := range claims {
			if c.ResourceClaimTemplateName != nil {
				n := "p-" + c.Name
				p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: c.Name, ResourceClaimName: &n})
			}
		}
		return p
	}
	all := map[string]bool{"p-a": true, "p-b": true, "p-c": true, "shared-a": true}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		ours map[string]bool
		want map[string]string
	}{
		"one container, two claims (bats gpu-two-claims-one-pod)": {
			pod:  pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b")}, ctr(ref("a"), ref("b"))),
			want: map[string]string{"p-a": "p-a,p-b", "p-b": "p-a,p-b"},
		},
		"two containers with the same two claims": {
			pod:  pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b")}, ctr(ref("b"), ref("a")), ctr(ref("a"), ref("b"))),
			want: map[string]string{"p-a": "p-a,p-b", "p-b": "p-a,p-b"},
		},
		"a claim also used alone": {
			pod: pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b")}, ctr(ref("a"), ref("b")), ctr(ref("a"))),
		},
		"different sets": {
			pod: pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b"), tmpl("c")}, ctr(ref("a"), ref("b")), ctr(ref("b"), ref("c"))),
		},
		"a request filter": {
			pod: pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b")}, ctr(ref("a"), corev1.ResourceClaim{Name: "b", Request: "gpu"})),
		},
		"a claim other pods may use": {
			pod: pod([]corev1.PodResourceClaim{named("a"), tmpl("b")}, ctr(ref("a"), ref("b"))),
		},
		"the other claim is not gpulink's": {
			pod:  pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b")}, ctr(ref("a"), ref("b"))),
			ours: map[string]bool{"p-a": true},
		},
		"each container its own claim": {
			pod: pod([]corev1.PodResourceClaim{tmpl("a"), tmpl("b")}, ctr(ref("a")), ctr(ref("b"))),
		},
	} {
		t.Run(name, func(t *testing.T) {
			ours := tc.ours
			if ours == nil {
				ours = all
			}
			got := containerClaimGroups(tc.pod, ours)
			if len(got) == 0 && len(tc.want) == 0 {
				return
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("groups %v, want %v", got, tc.want)
			}
		})
	}
}
