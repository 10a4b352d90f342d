//go:build integration

package compat_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
)

// templateFor is the name of the template the translation gives a pod
// asking for nvidia.com/gpu: gpus.
func (e *env) templateFor(gpus string) string {
	e.t.Helper()
	tr := &compat.Translator{Config: compat.DefaultConfig()}
	res, err := tr.Translate(e.gpuPod("x", gpus))
	if err != nil || res == nil || len(res.Claims) != 1 {
		e.t.Fatalf("translating nvidia.com/gpu: %s: %+v, %v", gpus, res, err)
	}
	return res.Claims[0].Template
}

// Hole 3 of issue 17: a namespace capped at 1 GPU by a quota on
// requests.nvidia.com/gpu must not get 8 through the translation, which
// takes nvidia.com/gpu off the pod before quota is charged. Without a
// quota on the DeviceClass the pod is refused, naming the quota and what
// to add; with one, the pod is admitted and its claim is charged to the
// class quota by the API server.
func TestCompatQuotaHolds(t *testing.T) {
	e := setup(t, time.Minute)
	quotas := e.client.CoreV1().ResourceQuotas(e.ns)
	gpuQuota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("1")}}}
	if _, err := quotas.Create(e.ctx, gpuQuota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The webhook reads quotas from an informer: wait until a dry run of
	// the 8-GPU pod is refused (or give up and let the real create show
	// what happens).
	var refusal error
	_ = wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, refusal = e.client.CoreV1().Pods(e.ns).Create(ctx, e.gpuPod("eight", "8"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return refusal != nil, nil
	})
	_, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("eight", "8"), metav1.CreateOptions{})
	if err == nil {
		time.Sleep(3 * time.Second)
		c := e.claimOf("eight")
		var devices int
		if c != nil && c.Status.Allocation != nil {
			devices = len(c.Status.Allocation.Devices.Results)
		}
		t.Fatalf("a pod asking for 8 GPUs was admitted in a namespace whose ResourceQuota allows requests.nvidia.com/gpu: 1 (its claim holds %d devices)", devices)
	}
	t.Logf("refused: %v", err)
	classQuota := driver.DeviceClassWhole + corev1.ResourceClaimsPerClass
	for _, want := range []string{"ResourceQuota gpus", "requests.nvidia.com/gpu: 1", "DeviceClass " + driver.DeviceClassWhole, classQuota + ": 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}

	// The operator moves the quota over to the DeviceClass.
	moved := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpu-devices"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceName(classQuota): resource.MustParse("1")}}}
	if _, err := quotas.Create(e.ctx, moved, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the class quota seen by the webhook", 10*time.Second, func() bool {
		_, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("eight", "8"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil
	})
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("eight", "8"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("with the class quota, the 8-GPU pod: %v", err)
	}
	// kube-controller-manager cannot create its 8-device claim: the API
	// server's quota admission refuses it, the pod stays gated without a
	// claim.
	msg := e.waitEvent("eight", "FailedResourceClaimCreation", time.Minute, "exceeded quota", classQuota)
	t.Logf("claim creation refused: %s", msg)
	p := e.getPod("eight")
	if e.claimOf("eight") != nil || len(p.Spec.SchedulingGates) == 0 || p.Spec.NodeName != "" {
		t.Errorf("8-GPU pod: claim %v, gates %v, node %q; want no claim, gated, unbound", e.claimOf("eight"), p.Spec.SchedulingGates, p.Spec.NodeName)
	}
	// One GPU fits the quota: allocated, bound, and counted.
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("one", "1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the 1-GPU pod bound", time.Minute, func() bool { return e.getPod("one").Spec.NodeName != "" })
	if c := e.claimOf("one"); c == nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Errorf("1-GPU pod's claim: %+v", c)
	}
	e.poll("quota usage 1", 30*time.Second, func() bool {
		q, err := quotas.Get(e.ctx, "gpu-devices", metav1.GetOptions{})
		used := q.Status.Used[corev1.ResourceName(classQuota)]
		return err == nil && used.Value() == 1
	})
}

// Defect 6 of issue 33: a namespace capped at 4096 MiB of GPU memory,
// with a share-class quota of 2 devices, got a 40000 MiB share, counted
// as one device. On the live API server with real ResourceQuotas (its
// GPUs have 32 GiB, so the share here is 30000 MiB): the share is refused and the message says what to do instead (no device
// count taken from the memory quota); a whole GPU, counted by the
// whole-GPU class quota, is admitted and charged to it.
func TestCompatMemoryQuotaHolds(t *testing.T) {
	e := setup(t, time.Minute)
	quotas := e.client.CoreV1().ResourceQuotas(e.ns)
	wholeQuota := driver.DeviceClassWhole + corev1.ResourceClaimsPerClass
	for _, q := range []*corev1.ResourceQuota{
		{ObjectMeta: metav1.ObjectMeta{Name: "gpumem"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.nvidia.com/gpumem": resource.MustParse("4096")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "devices"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			corev1.ResourceName(driver.DeviceClassShare + corev1.ResourceClaimsPerClass): resource.MustParse("2"),
			corev1.ResourceName(wholeQuota):                                              resource.MustParse("1"),
		}}},
	} {
		if _, err := quotas.Create(e.ctx, q, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	big := e.gpuPod("big", "1")
	big.Spec.Containers[0].Resources.Limits["nvidia.com/gpumem"] = resource.MustParse("30000")
	var err error
	_ = wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err = e.client.CoreV1().Pods(e.ns).Create(ctx, big.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil, nil
	})
	if _, err = e.client.CoreV1().Pods(e.ns).Create(e.ctx, big.DeepCopy(), metav1.CreateOptions{}); err == nil {
		t.Fatal("a 30000 MiB share was admitted in a namespace whose ResourceQuota allows requests.nvidia.com/gpumem: 4096")
	}
	t.Logf("refused: %v", err)
	for _, want := range []string{"ResourceQuota gpumem", "requests.nvidia.com/gpumem: 4096", "ask for whole GPUs", wholeQuota} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "devices: ") {
		t.Errorf("refusal %q suggests a device count", err)
	}
	// A whole GPU is counted by the whole-GPU class quota.
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("whole", "1"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a whole GPU beside the memory quota: %v", err)
	}
	e.poll("the whole GPU charged to "+wholeQuota, time.Minute, func() bool {
		q, err := quotas.Get(e.ctx, "devices", metav1.GetOptions{})
		used := q.Status.Used[corev1.ResourceName(wholeQuota)]
		return err == nil && used.Value() == 1
	})
}

// Hole 4 of issue 17: an AdmissionReview POSTed straight to the webhook's
// port (any pod could, the API server does not authenticate to it) makes
// nothing: the answer is only a patch, and the leader creates templates
// only for pods that exist. Translated pods still get their templates,
// claims and GPUs.
func TestCompatForgedReviewCreatesNothing(t *testing.T) {
	e := setup(t, time.Minute)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.caPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	forge := func(ns, gpus string) {
		t.Helper()
		pod := e.gpuPod("forged", gpus)
		pod.Namespace = ns
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		body, err := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "forged", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: ns, Operation: admissionv1.Create,
				Object: runtime.RawExtension{Raw: raw}},
		})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Post(e.webhookURL, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("POST to the webhook: %v", err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(out, &review); err != nil || review.Response == nil {
			t.Fatalf("webhook answered %s: %s", resp.Status, out)
		}
		t.Logf("forged review for %s (nvidia.com/gpu: %s): allowed %t, %d bytes of patch", ns, gpus, review.Response.Allowed, len(review.Response.Patch))
	}
	forge(metav1.NamespaceSystem, "3")
	forge(e.ns, "5")

	// A real pod: its template, claim and allocation come without the
	// webhook creating anything.
	start := time.Now()
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("real", "2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the real pod's claim", time.Minute, func() bool { return e.claimOf("real") != nil })
	claimed := time.Since(start)
	e.poll("the real pod bound", time.Minute, func() bool { return e.getPod("real").Spec.NodeName != "" })
	t.Logf("translated pod: claim created %.2fs, bound %.2fs after the pod was created", claimed.Seconds(), time.Since(start).Seconds())
	if c := e.claimOf("real"); c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 2 {
		t.Errorf("the real pod's claim: %+v", c.Status)
	}
	// The leader has processed pods since the forged reviews; give it a
	// moment more before asserting nothing else appeared.
	time.Sleep(2 * time.Second)
	if got := e.templates(metav1.NamespaceSystem); len(got) > 0 {
		t.Errorf("a forged AdmissionReview created templates %v in %s", got, metav1.NamespaceSystem)
	}
	if got, want := e.templates(e.ns), []string{e.templateFor("2")}; !slices.Equal(got, want) {
		t.Errorf("templates in %s: %v, want only the real pod's %v (forged 5-GPU shape: %s)", e.ns, got, want, e.templateFor("5"))
	}
}

// Hole 5 of issue 17: a namespace user pre-creates the template of the
// 1-GPU shape, labelled as gpulink's, asking for 8 GPUs. Another pod of
// that shape must not get the squatter's devices: the controller refuses
// the claim made from it and the leader tells the pod to delete the
// template. The collector leaves the user's template alone, while it
// collects the translation's own.
func TestCompatPreCreatedTemplateIsNotUsed(t *testing.T) {
	e := setup(t, 2*time.Second)
	name := e.templateFor("1")
	squat := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{compat.LabelManaged: "true"}},
		Spec: resourceapi.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{compat.LabelManaged: "true"}},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: compat.RequestName, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 8},
			}}}},
		},
	}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.ctx, squat, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("victim", "1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the victim's claim", time.Minute, func() bool { return e.claimOf("victim") != nil })
	// Give the controller time it would need to allocate.
	_ = wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return e.claimOf("victim").Status.Allocation != nil, nil
	})
	if c := e.claimOf("victim"); c.Status.Allocation != nil {
		t.Fatalf("the victim asking for 1 GPU was given the squatter's %d devices", len(c.Status.Allocation.Devices.Results))
	}
	msg := e.waitEvent("victim", "ClaimNotAllocatable", 30*time.Second, name, "8 device(s)")
	t.Logf("controller: %s", msg)
	msg = e.waitEvent("victim", "CompatTemplateConflict", 30*time.Second, e.ns+"/"+name, "Delete the template")
	t.Logf("leader: %s", msg)
	if p := e.getPod("victim"); len(p.Spec.SchedulingGates) == 0 || p.Spec.NodeName != "" {
		t.Errorf("victim: gates %v, node %q; want gated and unbound", p.Spec.SchedulingGates, p.Spec.NodeName)
	}

	// Collection: the translation's own template of another shape is
	// collected once its pod is gone, the squatter's labelled template is
	// not.
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("honest", "2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	honest := e.templateFor("2")
	e.poll("the honest pod bound", time.Minute, func() bool { return e.getPod("honest").Spec.NodeName != "" })
	for _, p := range []string{"victim", "honest"} {
		if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	e.poll("the honest template collected", time.Minute, func() bool { return !slices.Contains(e.templates(e.ns), honest) })
	if got := e.templates(e.ns); !slices.Contains(got, name) {
		t.Errorf("the user's template %s was collected (left: %v)", name, got)
	}
}

// The template names are computed from the spec as the API server stores
// it: every shape the translation makes, created and read back, still
// hashes to its name, and so does a user's spec written without the
// defaults the API server fills in.
func TestCompatTemplateNamesMatchStoredSpecs(t *testing.T) {
	e := setup(t, time.Minute)
	tr := &compat.Translator{Config: compat.DefaultConfig(), Inventory: sizes{40 << 30, 80 << 30}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "shapes", Namespace: e.ns,
		Annotations: map[string]string{compat.AnnotationUseGPUType: "A100"}}}
	for i, limits := range []map[string]string{
		{"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "4"},
		{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
		{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"},
		{"nvidia.com/gpumem-percentage": "33"},
		{"nvidia.com/gpucores": "7"},
	} {
		l := corev1.ResourceList{}
		for k, v := range limits {
			l[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Resources: corev1.ResourceRequirements{Limits: l}})
	}
	res, err := tr.Translate(pod)
	if err != nil {
		t.Fatal(err)
	}
	specs := map[string]resourceapi.ResourceClaimSpec{}
	for name, spec := range res.Templates {
		specs[name] = spec.Spec
	}
	// A user's 1-GPU template as people write it: no allocationMode, no
	// count, a toleration without operator.
	bare := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: compat.RequestName, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole,
			Tolerations: []resourceapi.DeviceToleration{{Key: "example.com/t", Value: "v", Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
	}}}}
	bareName, err := compat.TemplateName(bare)
	if err != nil {
		t.Fatal(err)
	}
	specs[bareName] = bare
	for name, spec := range specs {
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
		if _, err := e.client.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		stored, err := e.client.ResourceV1().ResourceClaimTemplates(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := compat.CheckTemplateName(name, stored.Spec.Spec); err != nil {
			b, _ := json.Marshal(stored.Spec.Spec)
			t.Errorf("stored template %s: %v\nstored spec: %s", name, err, b)
		}
	}
	t.Logf("%d stored templates hash to their names", len(specs))
}

type sizes []int64

func (s sizes) MemorySizes() []int64 { return s }
