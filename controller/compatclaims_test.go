package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// translatedSpec is the claim spec the translation gives a container
// asking for nvidia.com/gpu: n, and the template name it hashes to.
func translatedSpec(t *testing.T, n string) (string, resourceapi.ResourceClaimSpec) {
	t.Helper()
	tr := compat.Translator{Config: compat.DefaultConfig()}
	res, err := tr.Translate(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse(n)}},
	}}}})
	if err != nil || res == nil {
		t.Fatalf("translating nvidia.com/gpu: %s: %v", n, err)
	}
	name := res.Claims[0].Template
	return name, res.Templates[name].Spec
}

func TestCheckCompatClaim(t *testing.T) {
	oneName, one := translatedSpec(t, "1")
	_, eight := translatedSpec(t, "8")
	claim := func(spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns}, Spec: spec}
	}
	fromTemplate := func(name string) *corev1.PodResourceClaim {
		return &corev1.PodResourceClaim{Name: "gpulink-main", ResourceClaimTemplateName: ptr.To(name)}
	}
	if err := planner.CheckCompatClaim(fromTemplate(oneName), claim(one)); err != nil {
		t.Errorf("the translation's own claim: %v", err)
	}
	err := planner.CheckCompatClaim(fromTemplate(oneName), claim(eight))
	if err == nil {
		t.Fatal("an 8-GPU claim from the 1-GPU template name passed")
	}
	for _, want := range []string{"ResourceClaimTemplate " + oneName, "8 device(s)", "kubectl delete resourceclaimtemplate -n " + ns + " " + oneName} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// Templates outside the translation's names, claims by name, and
	// claims already allocated by someone else are not the check's concern.
	if err := planner.CheckCompatClaim(fromTemplate("my-template"), claim(eight)); err != nil {
		t.Errorf("user template: %v", err)
	}
	if err := planner.CheckCompatClaim(&corev1.PodResourceClaim{Name: "x", ResourceClaimName: ptr.To("c")}, claim(eight)); err != nil {
		t.Errorf("claim by name: %v", err)
	}
	allocated := claim(eight)
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	if err := planner.CheckCompatClaim(fromTemplate(oneName), allocated); err != nil {
		t.Errorf("allocated claim: %v", err)
	}
}

// A pod whose claim came from a template squatting on a translated name
// stays gated with a Warning; a pod whose claim came from the real
// template is allocated.
func TestControllerRefusesSquattedCompatClaim(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "node", "pcie-4.txt"))...).start()
	oneName, one := translatedSpec(t, "1")
	_, two := translatedSpec(t, "2")
	templatePod := func(pod, claim string, spec resourceapi.ResourceClaimSpec) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x"}},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpulink-main", ResourceClaimTemplateName: ptr.To(oneName)}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}},
			Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpulink-main", ResourceClaimName: ptr.To(claim)}}},
		}
		// As the resourceclaim controller makes it: owned by the pod,
		// the template's spec copied.
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns, UID: uuid.NewUUID(),
			Annotations:     map[string]string{resourceapi.PodResourceClaimAnnotation: "gpulink-main"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: p.UID, Controller: ptr.To(true)}}},
			Spec: spec}
		if _, err := h.client.ResourceV1().ResourceClaims(ns).Create(h.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	templatePod("victim", "victim-gpulink-main-abcde", two)
	templatePod("honest", "honest-gpulink-main-fghij", one)
	h.waitAllocated("honest-gpulink-main-fghij")
	e := h.waitEvent(ns+"/victim", report.ReasonUninterpretable)
	if e.Type != corev1.EventTypeWarning || !contains(e.Note, oneName) || !contains(e.Note, "Delete the template") {
		t.Errorf("event %+v", e)
	}
	if c := h.getClaim("victim-gpulink-main-abcde"); c.Status.Allocation != nil {
		t.Errorf("the squatter's claim was allocated: %+v", c.Status.Allocation)
	}
	if gateIndex(h.getPod("victim")) < 0 {
		t.Error("the victim pod was ungated")
	}
}
