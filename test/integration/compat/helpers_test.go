//go:build integration

package compat_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/compat/admission"
	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/localcluster"
)

// env is one test's namespace and 8-GPU API-only node on the shared
// cluster, with gpulink's controller, the translation webhook (registered
// by URL for this namespace only) and the leader's part running
// in-process.
type env struct {
	t          *testing.T
	ctx        context.Context
	client     kubernetes.Interface
	ns, node   string
	webhookURL string
	caPEM      []byte
}

// setup starts everything; grace is the templates' collection grace.
func setup(t *testing.T, grace time.Duration) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ctx = klog.NewContext(ctx, klog.Background().WithName(t.Name()))
	cfg := cluster.RESTConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	id := mrand.IntN(1_000_000)
	e := &env{t: t, ctx: ctx, client: client, ns: fmt.Sprintf("compat-%d", id), node: fmt.Sprintf("gpu-%d", id)}
	for _, c := range planner.DeviceClasses() {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("service account "+e.ns+"/default", time.Minute, func() bool {
		_, err := client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	e.addNode()

	// The webhook's serving certificate.
	certDir := t.TempDir()
	e.caPEM = writeCert(t, certDir)
	port := localcluster.FreePort(t)
	e.webhookURL = fmt.Sprintf("https://127.0.0.1:%d%s", port, admission.Path)

	rec, stopRec := controller.NewRecorder(ctx, client)
	opts := admission.Options{
		Address: fmt.Sprintf("127.0.0.1:%d", port), CertDir: certDir, Config: compat.DefaultConfig(),
		Grace: grace, Metrics: prometheus.NewRegistry(), Recorder: rec,
	}
	ctrl, err := controller.New(controller.Config{
		Client: client, Recorder: rec, Workers: 2, DeviceTaintRules: true,
		Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}, WaitingRetry: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	run("webhook", func(ctx context.Context) error { return admission.Serve(ctx, client, opts) })
	run("leader", func(ctx context.Context) error { return admission.Lead(ctx, client, opts) })
	run("controller", ctrl.Run)
	t.Cleanup(func() {
		e.teardown()
		cancel()
		wg.Wait()
		stopRec()
	})
	e.poll("controller caches", time.Minute, ctrl.Ready)
	e.registerWebhook()
	return e
}

// addNode creates the API-only node with 8 A100s and its slice.
func (e *env) addNode() {
	e.t.Helper()
	topo, err := topology.ParseFile("../../../driver/topology/testdata/dgx-a100.txt")
	if err != nil {
		e.t.Fatal(err)
	}
	n, err := e.client.CoreV1().Nodes().Create(e.ctx, controllertest.Node(e.node), metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := localcluster.UntaintNewNode(e.ctx, e.client, n); err != nil {
		e.t.Fatal(err)
	}
	slice, err := controllertest.Slice(e.node, topo, controllertest.SliceOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.ResourceV1().ResourceSlices().Create(e.ctx, slice, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// registerWebhook registers the translation webhook as the chart does
// (sideEffects None, failurePolicy Fail), by URL and for this test's
// namespace only, and waits until the API server calls it.
func (e *env) registerWebhook() {
	e.t.Helper()
	wh := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: e.ns},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name:                    "translate-pods.gpu.gpulink.dev",
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregv1.Fail),
			ReinvocationPolicy:      ptr.To(admissionregv1.NeverReinvocationPolicy),
			TimeoutSeconds:          ptr.To[int32](10),
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: ptr.To(e.webhookURL), CABundle: e.caPEM},
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: ptr.To(admissionregv1.NamespacedScope)},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: e.ns}},
		}},
	}
	if _, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(e.ctx, wh, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.poll("the translation webhook in effect", time.Minute, func() bool {
		p, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, e.gpuPod("probe", "1"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(p.Spec.ResourceClaims) == 1
	})
}

func (e *env) teardown() {
	ctx := context.Background()
	_ = e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, e.ns, metav1.DeleteOptions{})
	_ = e.client.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	localcluster.DeleteClaims(ctx, e.client, e.ns)
	_ = e.client.ResourceV1().ResourceSlices().Delete(ctx, e.node+"-gpu.gpulink.dev", metav1.DeleteOptions{})
	_ = e.client.CoreV1().Nodes().Delete(ctx, e.node, metav1.DeleteOptions{})
	_ = e.client.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{})
}

func (e *env) poll(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		e.t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// gpuPod is a pod written for the NVIDIA device plugin asking for gpus.
func (e *env) gpuPod(name, gpus string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse(gpus)}}}},
			NodeSelector:                  map[string]string{corev1.LabelHostname: e.node},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

func (e *env) getPod(name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// claimOf returns the pod's claim created from a template, nil while none.
func (e *env) claimOf(name string) *resourceapi.ResourceClaim {
	e.t.Helper()
	for _, s := range e.getPod(name).Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, *s.ResourceClaimName, metav1.GetOptions{})
		if err == nil {
			return c
		}
	}
	return nil
}

// waitEvent waits for an event on the pod with the reason whose message
// contains every string of want, and returns its message.
func (e *env) waitEvent(pod, reason string, timeout time.Duration, want ...string) string {
	e.t.Helper()
	var msg string
	var seen []string
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		evs, err := e.client.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, ev := range evs.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason != reason {
				continue
			}
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(ev.Message, w)
			}
			if ok {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no %s event on pod %s mentioning %q within %s; events:\n%s", reason, pod, want, timeout, strings.Join(seen, "\n"))
	}
	return msg
}

// templates returns the names of the gpulink-compat-* templates in ns.
func (e *env) templates(ns string) []string {
	e.t.Helper()
	l, err := e.client.ResourceV1().ResourceClaimTemplates(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, t := range l.Items {
		if strings.HasPrefix(t.Name, compat.TemplatePrefix) {
			out = append(out, t.Name)
		}
	}
	return out
}

// writeCert writes a self-signed serving certificate for 127.0.0.1 (tls.crt,
// tls.key) and returns it in PEM as the webhook's CA bundle.
func writeCert(t *testing.T, dir string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpulink-webhook"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPEM
}
