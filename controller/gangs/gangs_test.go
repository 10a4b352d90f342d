package gangs

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func pod(labels, annotations map[string]string, group string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: labels, Annotations: annotations}}
	if group != "" {
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group)}
	}
	return p
}

func TestRefOf(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		podGroups bool
		want      string
	}{
		{"none", pod(nil, nil, ""), true, ""},
		{"label", pod(map[string]string{LabelGang: "a"}, nil, ""), true, "ns/labels/a"},
		{"annotation", pod(nil, map[string]string{LabelGang: "a"}, ""), true, "ns/labels/a"},
		{"label wins over annotation", pod(map[string]string{LabelGang: "a"}, map[string]string{LabelGang: "b"}, ""), true, "ns/labels/a"},
		{"PodGroup wins over label", pod(map[string]string{LabelGang: "a"}, nil, "pg"), true, "ns/PodGroup/pg"},
		{"PodGroup API not served: label", pod(map[string]string{LabelGang: "a"}, nil, "pg"), false, "ns/labels/a"},
		{"PodGroup API not served, no label", pod(nil, nil, "pg"), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := RefOf(tc.pod, tc.podGroups)
			got := ""
			if ok {
				got = r.Key()
			}
			if got != tc.want {
				t.Errorf("RefOf = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFromLabels(t *testing.T) {
	ref := Ref{Namespace: "ns", Name: "a", Source: SourceLabels}
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		want    Spec
		wantErr string
	}{
		{"size only", map[string]string{LabelGang: "a", LabelSize: "4"}, Spec{Ref: ref, MinCount: 4}, ""},
		{"level defaults to Required", map[string]string{LabelGang: "a", LabelSize: "4", LabelLevel: "leaf"},
			Spec{Ref: ref, MinCount: 4, Level: "leaf", Policy: Required, Why: "pod label " + LabelLevel}, ""},
		{"Preferred", map[string]string{LabelGang: "a", LabelSize: "2", LabelLevel: "leaf", LabelPolicy: "preferred"},
			Spec{Ref: ref, MinCount: 2, Level: "leaf", Policy: Preferred, Why: "pod label " + LabelLevel + ", policy from pod label " + LabelPolicy}, ""},
		{"size missing", map[string]string{LabelGang: "a"}, Spec{}, LabelSize + " is missing"},
		{"size zero", map[string]string{LabelGang: "a", LabelSize: "0"}, Spec{}, "want a positive integer"},
		{"size not a number", map[string]string{LabelGang: "a", LabelSize: "four"}, Spec{}, `"four": want a positive integer`},
		{"bad policy", map[string]string{LabelGang: "a", LabelSize: "2", LabelLevel: "leaf", LabelPolicy: "Maybe"}, Spec{}, "want Required or Preferred"},
		{"policy without level", map[string]string{LabelGang: "a", LabelSize: "2", LabelPolicy: "Preferred"}, Spec{}, "without a level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromLabels(ref, pod(tc.labels, nil, ""))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Ref != tc.want.Ref || got.MinCount != tc.want.MinCount || got.Level != tc.want.Level || got.Policy != tc.want.Policy || got.Why != tc.want.Why {
				t.Errorf("spec = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFromPodGroup(t *testing.T) {
	ref := Ref{Namespace: "ns", Name: "pg", Source: SourcePodGroup}
	pg := func(minCount int32, key string, claims ...string) *schedulingv1beta1.PodGroup {
		g := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pg"}}
		if minCount > 0 {
			g.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}
		} else {
			g.Spec.SchedulingPolicy.Basic = &schedulingv1beta1.BasicSchedulingPolicy{}
		}
		if key != "" {
			g.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: key}}}
		}
		for _, c := range claims {
			g.Spec.ResourceClaims = append(g.Spec.ResourceClaims, schedulingv1beta1.PodGroupResourceClaim{Name: c, ResourceClaimTemplateName: ptr.To("t")})
		}
		return g
	}
	if _, ok, err := FromPodGroup(ref, pg(0, ""), nil); ok || err != nil {
		t.Errorf("basic policy: ok=%v err=%v, want no gang", ok, err)
	}
	s, ok, err := FromPodGroup(ref, pg(4, "network.topology.nvidia.com/leaf", "shared"), nil)
	if !ok || err != nil || s.MinCount != 4 || s.Level != "network.topology.nvidia.com/leaf" || s.Policy != Required || len(s.GroupClaims) != 1 || s.GroupClaims[0] != "shared" {
		t.Errorf("gang with topology: %+v ok=%v err=%v", s, ok, err)
	}
	// A pod of a group without a topology constraint asks for a
	// Preferred level, which PodGroups cannot say.
	s, _, err = FromPodGroup(ref, pg(4, ""), pod(map[string]string{LabelLevel: "leaf", LabelPolicy: "Preferred"}, nil, "pg"))
	if err != nil || s.Policy != Preferred || s.Level != "leaf" {
		t.Errorf("PodGroup with a pod's Preferred level: %+v err=%v", s, err)
	}
	// kube-scheduler enforces the PodGroup's own key: no relaxing it.
	_, _, err = FromPodGroup(ref, pg(4, "network.topology.nvidia.com/leaf"), pod(map[string]string{LabelPolicy: "Preferred"}, nil, "pg"))
	if err == nil || !strings.Contains(err.Error(), "cannot relax") {
		t.Errorf("Preferred over a PodGroup topology key: err=%v, want a refusal", err)
	}
}

// TestLabelNameFrom: a shared pod template names the label that holds each
// group's gang name (LeaderWorkerSet's group key); pods of two groups are
// two gangs, and a pod without that label is refused, not placed alone.
func TestLabelNameFrom(t *testing.T) {
	const groupKey = "leaderworkerset.sigs.k8s.io/group-key"
	ann := map[string]string{LabelNameFrom: groupKey}
	a := pod(map[string]string{groupKey: "5d41402abc", LabelSize: "4"}, ann, "")
	b := pod(map[string]string{groupKey: "7d793037a0", LabelSize: "4"}, ann, "")
	ra, oka := RefOf(a, true)
	rb, okb := RefOf(b, true)
	if !oka || !okb || ra.Key() != "ns/labels/5d41402abc" || rb.Key() != "ns/labels/7d793037a0" {
		t.Fatalf("refs %q (%v), %q (%v): want one gang per group key", ra.Key(), oka, rb.Key(), okb)
	}
	if s, err := FromLabels(ra, a); err != nil || s.MinCount != 4 || s.Name != "5d41402abc" {
		t.Errorf("spec %+v err %v, want gang 5d41402abc of 4", s, err)
	}
	// LabelGang wins over LabelNameFrom.
	both := pod(map[string]string{LabelGang: "fixed", groupKey: "5d41402abc"}, ann, "")
	if r, _ := RefOf(both, true); r.Name != "fixed" {
		t.Errorf("LabelGang and LabelNameFrom: gang %q, want fixed", r.Name)
	}
	missing := pod(map[string]string{LabelSize: "4"}, ann, "")
	r, ok := RefOf(missing, true)
	if !ok {
		t.Fatal("a pod with LabelNameFrom but not its label is in no gang: it would be placed alone")
	}
	if _, err := FromLabels(r, missing); err == nil || !strings.Contains(err.Error(), groupKey) {
		t.Errorf("err = %v, want one naming %s", err, groupKey)
	}
}

// TestResolve: a basic PodGroup (what the Job controller creates for every
// Job with WorkloadWithJob unless spec.scheduling asks for a gang) gives
// way to the pod's gang labels, or makes no gang without them; a gang
// PodGroup and a missing one keep the pod.
func TestResolve(t *testing.T) {
	basic := &schedulingv1beta1.PodGroup{Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}}}
	gangPG := &schedulingv1beta1.PodGroup{Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 4}}}}
	groups := map[string]*schedulingv1beta1.PodGroup{"basic": basic, "gang": gangPG}
	lookup := func(ns, name string) (*schedulingv1beta1.PodGroup, bool) {
		pg, ok := groups[name]
		return pg, ok && ns == "ns"
	}
	labels := map[string]string{LabelGang: "train", LabelSize: "4"}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		lookup PodGroupLookup
		want   string
	}{
		{"basic PodGroup, labels", pod(labels, nil, "basic"), lookup, "ns/labels/train"},
		{"basic PodGroup, no labels: no gang", pod(nil, nil, "basic"), lookup, ""},
		{"gang PodGroup wins", pod(labels, nil, "gang"), lookup, "ns/PodGroup/gang"},
		{"PodGroup not created yet", pod(labels, nil, "later"), lookup, "ns/PodGroup/later"},
		{"no lookup", pod(labels, nil, "basic"), nil, "ns/PodGroup/basic"},
		{"labels only", pod(labels, nil, ""), lookup, "ns/labels/train"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := Resolve(tc.pod, true, tc.lookup)
			got := ""
			if ok {
				got = r.Key()
			}
			if got != tc.want {
				t.Errorf("Resolve = %q (%v), want %q", got, ok, tc.want)
			}
		})
	}
	var keys []string
	for _, r := range Candidates(pod(labels, nil, "basic"), true) {
		keys = append(keys, r.Key())
	}
	if strings.Join(keys, ",") != "ns/PodGroup/basic,ns/labels/train" {
		t.Errorf("Candidates = %v, want the PodGroup and the label gang", keys)
	}
}
