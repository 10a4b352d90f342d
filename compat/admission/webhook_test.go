package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
)

func gpuPod(name string, limits map[string]string) *corev1.Pod {
	l := corev1.ResourceList{}
	for k, v := range limits {
		l[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox", Resources: corev1.ResourceRequirements{Limits: l}}}},
	}
}

func review(t *testing.T, h http.Handler, pod *corev1.Pod, dryRun bool) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	in := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("req-1"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: pod.Namespace, Operation: admissionv1.Create, DryRun: ptr.To(dryRun),
			Object: runtime.RawExtension{Raw: raw},
		},
	}
	body, _ := json.Marshal(in)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || out.Response.UID != "req-1" || out.Kind != "AdmissionReview" {
		t.Fatalf("response %+v", out)
	}
	return out.Response
}

func apply(t *testing.T, pod *corev1.Pod, resp *admissionv1.AdmissionResponse) *corev1.Pod {
	t.Helper()
	raw, _ := json.Marshal(pod)
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s: %v", resp.Patch, err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(patched, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func newWebhook(client *fake.Clientset) *Webhook {
	return &Webhook{
		Translator: &compat.Translator{Config: compat.DefaultConfig(), Inventory: staticSizes{40 << 30}},
		Templates:  &Templates{Client: client, Grace: time.Minute},
	}
}

type staticSizes []int64

func (s staticSizes) MemorySizes() []int64 { return s }

func TestWebhookTranslates(t *testing.T) {
	client := fake.NewClientset()
	h := newWebhook(client)
	pod := gpuPod("train", map[string]string{"nvidia.com/gpu": "2", "cpu": "1"})
	resp := review(t, h, pod, false)
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("response %+v", resp)
	}
	got := apply(t, pod, resp)
	c := got.Spec.Containers[0]
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; ok || c.Resources.Limits.Cpu().String() != "1" {
		t.Errorf("limits %v", c.Resources.Limits)
	}
	if len(got.Spec.ResourceClaims) != 1 || len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != got.Spec.ResourceClaims[0].Name {
		t.Fatalf("claims %+v %+v", got.Spec.ResourceClaims, c.Resources.Claims)
	}
	if len(got.Spec.SchedulingGates) != 1 || got.Spec.SchedulingGates[0].Name != driver.SchedulingGate {
		t.Errorf("gates %+v", got.Spec.SchedulingGates)
	}
	name := *got.Spec.ResourceClaims[0].ResourceClaimTemplateName
	tmpl, err := client.ResourceV1().ResourceClaimTemplates("team").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("template %s: %v", name, err)
	}
	if tmpl.Labels[compat.LabelManaged] != "true" || tmpl.Annotations[AnnotationLastAdmitted] == "" || tmpl.Spec.Spec.Devices.Requests[0].Exactly.Count != 2 {
		t.Errorf("template %+v", tmpl)
	}
	// A second pod of the same shape reuses the template.
	resp = review(t, h, gpuPod("train2", map[string]string{"nvidia.com/gpu": "2"}), false)
	if !resp.Allowed {
		t.Fatal(resp.Result)
	}
	list, _ := client.ResourceV1().ResourceClaimTemplates("team").List(context.Background(), metav1.ListOptions{})
	if len(list.Items) != 1 {
		t.Errorf("%d templates, want 1", len(list.Items))
	}
}

func TestWebhookRefusesAndLeavesOthers(t *testing.T) {
	client := fake.NewClientset()
	h := newWebhook(client)
	resp := review(t, h, gpuPod("bad", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}), false)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity || !strings.Contains(resp.Result.Message, "nvidia.com/gpucores: 150") {
		t.Fatalf("response %+v", resp)
	}
	resp = review(t, h, gpuPod("big", map[string]string{"nvidia.com/gpumem": "50000"}), false)
	if resp.Allowed || !strings.Contains(resp.Result.Message, "more than any GPU") {
		t.Fatalf("response %+v", resp.Result)
	}
	resp = review(t, h, gpuPod("cpu", map[string]string{"cpu": "1"}), false)
	if !resp.Allowed || resp.Patch != nil {
		t.Fatalf("cpu pod: %+v", resp)
	}
	// Dry runs create nothing.
	resp = review(t, h, gpuPod("dry", map[string]string{"nvidia.com/gpu": "1"}), true)
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("dry run: %+v", resp)
	}
	list, _ := client.ResourceV1().ResourceClaimTemplates("team").List(context.Background(), metav1.ListOptions{})
	if len(list.Items) != 0 {
		t.Errorf("refused or dry-run pods left %d templates", len(list.Items))
	}
}

func TestTemplatesRefuseForeignAndRefresh(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	foreign := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "team"}}
	old := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "y", Namespace: "team",
		Labels:      map[string]string{compat.LabelManaged: "true"},
		Annotations: map[string]string{AnnotationLastAdmitted: now.Add(-time.Hour).Format(time.RFC3339)}}}
	client := fake.NewClientset(foreign, old)
	ts := &Templates{Client: client, Grace: time.Minute, Now: func() time.Time { return now }}
	if err := ts.Ensure(context.Background(), "team", "x", resourceapi.ResourceClaimTemplateSpec{}); err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Errorf("foreign template: %v", err)
	}
	if err := ts.Ensure(context.Background(), "team", "y", resourceapi.ResourceClaimTemplateSpec{}); err != nil {
		t.Fatal(err)
	}
	got, _ := client.ResourceV1().ResourceClaimTemplates("team").Get(context.Background(), "y", metav1.GetOptions{})
	if got.Annotations[AnnotationLastAdmitted] != now.Format(time.RFC3339) {
		t.Errorf("admission time not refreshed: %v", got.Annotations)
	}
}

func TestCollector(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tmpl := func(name string, age time.Duration, managed bool) *resourceapi.ResourceClaimTemplate {
		t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team",
			CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
			Annotations:       map[string]string{AnnotationLastAdmitted: now.Add(-age).Format(time.RFC3339)}}}
		if managed {
			t.Labels = map[string]string{compat.LabelManaged: "true"}
		}
		return t
	}
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team"},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "g", ResourceClaimTemplateName: ptr.To("used")}}}}
	client := fake.NewClientset(
		tmpl("unused-old", 10*time.Minute, true),
		tmpl("unused-recent", 30*time.Second, true),
		tmpl("used", 10*time.Minute, true),
		tmpl("not-ours", 10*time.Minute, false),
		user,
	)
	c := &Collector{Client: client, Grace: 5 * time.Minute, Now: func() time.Time { return now }}
	n, err := c.Collect(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	list, _ := client.ResourceV1().ResourceClaimTemplates("team").List(context.Background(), metav1.ListOptions{})
	var left []string
	for _, t := range list.Items {
		left = append(left, t.Name)
	}
	if strings.Join(left, ",") != "not-ours,unused-recent,used" {
		t.Errorf("left %v", left)
	}
	// Once the pod is gone, its template goes too.
	_ = client.CoreV1().Pods("team").Delete(context.Background(), "p", metav1.DeleteOptions{})
	if n, err := c.Collect(context.Background()); err != nil || n != 1 {
		t.Fatalf("after pod deletion: deleted %d, %v", n, err)
	}
}
