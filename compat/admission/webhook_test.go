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

func newWebhook(quotas ...*corev1.ResourceQuota) *Webhook {
	tr := &compat.Translator{Config: compat.DefaultConfig(), Inventory: staticSizes{40 << 30}}
	return &Webhook{Translator: tr, Quota: NewQuotaGuard(quotaLister(quotas...), tr)}
}

type staticSizes []int64

func (s staticSizes) MemorySizes() []int64 { return s }

// The webhook answers with a patch and nothing else: the template the pod
// needs travels in its annotation, under the name its spec hashes to.
func TestWebhookTranslates(t *testing.T) {
	h := newWebhook()
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
	specs, err := compat.DecodeTemplates(got.Annotations[compat.AnnotationTemplates])
	if err != nil {
		t.Fatal(err)
	}
	spec, ok := specs[name]
	if !ok || len(specs) != 1 || spec.Devices.Requests[0].Exactly.Count != 2 {
		t.Fatalf("annotation %s: %+v, want the 2-GPU spec of %s", compat.AnnotationTemplates, specs, name)
	}
	if err := compat.CheckTemplateName(name, spec); err != nil {
		t.Error(err)
	}
	if got.Labels[compat.LabelManaged] != "true" {
		t.Errorf("labels %v", got.Labels)
	}
}

func TestWebhookRefusesAndLeavesOthers(t *testing.T) {
	h := newWebhook()
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
	resp = review(t, h, gpuPod("dry", map[string]string{"nvidia.com/gpu": "1"}), true)
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("dry run: %+v", resp)
	}
}

// A pod the API server sends (the chart's matchConditions name
// aliyun.com/gpu after `helm upgrade --set compat.families.aliyun.enabled`)
// but the running configuration does not translate (the family still off
// in this replica's --compat-config) is refused with a message, never
// admitted untranslated to wait for a resource no node has (issue 18,
// defect 3).
func TestWebhookRefusesWhatItWasCalledForButDoesNotTranslate(t *testing.T) {
	h := newWebhook()
	pod := gpuPod("aliyun", map[string]string{"aliyun.com/gpu": "2", "cpu": "1", "hugepages-2Mi": "2Mi"})
	resp := review(t, h, pod, false)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusServiceUnavailable {
		t.Fatalf("response %+v", resp)
	}
	for _, want := range []string{"aliyun.com/gpu", "--compat-config", "helm upgrade", "retry"} {
		if !strings.Contains(resp.Result.Message, want) {
			t.Errorf("message %q lacks %q", resp.Result.Message, want)
		}
	}
	if strings.Contains(resp.Result.Message, "cpu") || strings.Contains(resp.Result.Message, "hugepages") {
		t.Errorf("message %q names standard resources", resp.Result.Message)
	}
	// A pod with only standard resources (a direct call; the API server
	// would not send it) is still none of the webhook's business.
	if resp := review(t, h, gpuPod("plain", map[string]string{"cpu": "1", "example.kubernetes.io/x": "1"}), false); !resp.Allowed {
		t.Errorf("plain pod refused: %+v", resp.Result)
	}
}

// A namespace whose quota limits nvidia.com/gpu gets no translation unless
// a quota also limits the DeviceClass the GPUs would come from; the
// refusal names the quota, the resource and what to add.
func TestWebhookRefusesTranslationEscapingQuota(t *testing.T) {
	gpuQuota := quota("gpus", "team", map[string]string{"requests.nvidia.com/gpu": "1"})
	wholeQuota := quota("classes", "team", map[string]string{driver.DeviceClassWhole + ".deviceclass.resource.k8s.io/devices": "1"})
	shareQuota := quota("shares", "team", map[string]string{driver.DeviceClassShare + ".deviceclass.resource.k8s.io/devices": "4"})
	whole := map[string]string{"nvidia.com/gpu": "8"}
	share := map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}

	resp := review(t, newWebhook(gpuQuota), gpuPod("eight", whole), false)
	if resp.Allowed || resp.Result.Code != http.StatusForbidden {
		t.Fatalf("8 GPUs past a 1-GPU quota: %+v", resp)
	}
	for _, want := range []string{"ResourceQuota gpus", "requests.nvidia.com/gpu: 1", "DeviceClass " + driver.DeviceClassWhole,
		driver.DeviceClassWhole + ".deviceclass.resource.k8s.io/devices: 1", "Coming from the device plugin"} {
		if !strings.Contains(resp.Result.Message, want) {
			t.Errorf("refusal %q does not mention %q", resp.Result.Message, want)
		}
	}
	// With the whole-GPU class limited, whole GPUs are translated (the
	// claim is then counted by that quota), shares still are not.
	if resp := review(t, newWebhook(gpuQuota, wholeQuota), gpuPod("eight", whole), false); !resp.Allowed {
		t.Errorf("whole GPUs with the class quota: %+v", resp.Result)
	}
	resp = review(t, newWebhook(gpuQuota, wholeQuota), gpuPod("share", share), false)
	if resp.Allowed || !strings.Contains(resp.Result.Message, driver.DeviceClassShare) {
		t.Errorf("a share without a share-class quota: %+v", resp.Result)
	}
	if resp := review(t, newWebhook(gpuQuota, wholeQuota, shareQuota), gpuPod("share", share), false); !resp.Allowed {
		t.Errorf("a share with the share-class quota: %+v", resp.Result)
	}
	// Quotas of other namespaces, and quotas on other names, do not count.
	other := quota("gpus", "elsewhere", map[string]string{"requests.nvidia.com/gpu": "1"})
	cpu := quota("cpu", "team", map[string]string{"requests.cpu": "4"})
	if resp := review(t, newWebhook(other, cpu), gpuPod("eight", whole), false); !resp.Allowed {
		t.Errorf("no GPU quota in the namespace: %+v", resp.Result)
	}
}

// A quota on GPU memory keeps meaning memory: a namespace capped at 4096
// MiB of GPU memory, with a share-class quota of 2 devices, does not get a
// 40000 MiB share translated and counted as one device. The refusal says
// what to do instead and never suggests a device count taken from a
// memory or core quota (4096 devices would be 4096 shares of any size).
func TestWebhookKeepsMemoryAndCoreQuotas(t *testing.T) {
	memQuota := quota("gpumem", "team", map[string]string{"requests.nvidia.com/gpumem": "4096"})
	shareQuota := quota("shares", "team", map[string]string{driver.DeviceClassShare + ".deviceclass.resource.k8s.io/devices": "2"})
	wholeQuota := quota("whole", "team", map[string]string{driver.DeviceClassWhole + ".deviceclass.resource.k8s.io/devices": "1"})
	for _, tc := range []struct {
		name   string
		quota  *corev1.ResourceQuota
		limits map[string]string
		want   []string
	}{
		{"40000 MiB past a 4096 MiB quota", memQuota, map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000"},
			[]string{"ResourceQuota gpumem", "requests.nvidia.com/gpumem: 4096", "GPU memory", "ask for whole GPUs", driver.DeviceClassWhole + ".deviceclass.resource.k8s.io/devices"}},
		{"a memory percentage", memQuota, map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "90"},
			[]string{"requests.nvidia.com/gpumem: 4096", "GPU memory"}},
		{"cores past a core quota", quota("cores", "team", map[string]string{"limits.nvidia.com/gpucores": "50"}), map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"},
			[]string{"limits.nvidia.com/gpucores: 50", "GPU cores"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := review(t, newWebhook(tc.quota, shareQuota, wholeQuota), gpuPod("big", tc.limits), false)
			if resp.Allowed || resp.Result.Code != http.StatusForbidden {
				t.Fatalf("translated past the quota: %+v", resp)
			}
			for _, w := range tc.want {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("refusal %q does not mention %q", resp.Result.Message, w)
				}
			}
			if strings.Contains(resp.Result.Message, "devices: ") {
				t.Errorf("refusal %q suggests a device count", resp.Result.Message)
			}
		})
	}
	// Whole GPUs are counted by the whole class's quota: translated.
	if resp := review(t, newWebhook(memQuota, wholeQuota), gpuPod("whole", map[string]string{"nvidia.com/gpu": "1"}), false); !resp.Allowed {
		t.Errorf("a whole GPU beside a memory quota, with the whole-GPU class quota: %+v", resp.Result)
	}
	// Without the class quota, the refusal asks for one without taking
	// its value from the memory quota.
	resp := review(t, newWebhook(memQuota), gpuPod("whole", map[string]string{"nvidia.com/gpu": "1"}), false)
	if resp.Allowed || strings.Contains(resp.Result.Message, "devices: 4096") || !strings.Contains(resp.Result.Message, "devices: <how many devices") {
		t.Errorf("a whole GPU beside a memory quota, without a class quota: %+v", resp.Result)
	}
}

func TestCollector(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Templates of the translation are named by their spec's hash.
	spec := func(n int64) resourceapi.ResourceClaimSpec {
		return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: compat.RequestName,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n}}}}}
	}
	name := func(n int64) string {
		s, err := compat.TemplateName(spec(n))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tmpl := func(name string, n int64, age time.Duration, managed bool) *resourceapi.ResourceClaimTemplate {
		t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team",
			CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
			Annotations:       map[string]string{AnnotationLastAdmitted: now.Add(-age).Format(time.RFC3339)}},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec(n)}}
		if managed {
			t.Labels = map[string]string{compat.LabelManaged: "true"}
		}
		return t
	}
	unusedOld, unusedRecent, used, notOurs := name(1), name(2), name(3), name(4)
	// A user's template under a translated name with the label, whose spec
	// (8 GPUs) does not hash to its name: not gpulink's, never collected.
	squatter := name(5)
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team"},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "g", ResourceClaimTemplateName: ptr.To(used)}}}}
	client := fake.NewClientset(
		tmpl(unusedOld, 1, 10*time.Minute, true),
		tmpl(unusedRecent, 2, 30*time.Second, true),
		tmpl(used, 3, 10*time.Minute, true),
		tmpl(notOurs, 4, 10*time.Minute, false),
		tmpl(squatter, 8, 10*time.Minute, true),
		tmpl("labelled-user-template", 1, 10*time.Minute, true),
		user,
	)
	c := &Collector{Client: client, Grace: 5 * time.Minute, Now: func() time.Time { return now }}
	n, err := c.Collect(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	left := func() map[string]bool {
		list, _ := client.ResourceV1().ResourceClaimTemplates("team").List(context.Background(), metav1.ListOptions{})
		out := map[string]bool{}
		for _, t := range list.Items {
			out[t.Name] = true
		}
		return out
	}
	l := left()
	if l[unusedOld] || !l[unusedRecent] || !l[used] || !l[notOurs] || !l[squatter] || !l["labelled-user-template"] {
		t.Errorf("left %v; want all but %s", l, unusedOld)
	}
	// Once the pod is gone, its template goes too.
	_ = client.CoreV1().Pods("team").Delete(context.Background(), "p", metav1.DeleteOptions{})
	if n, err := c.Collect(context.Background()); err != nil || n != 1 {
		t.Fatalf("after pod deletion: deleted %d, %v", n, err)
	}
	if l := left(); l[used] || !l[squatter] {
		t.Errorf("left %v", l)
	}
}
