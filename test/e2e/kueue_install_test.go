//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/test/localcluster"
)

// Kueue as its own install does it, with what a process on the local
// cluster needs instead of a Deployment behind a Service: the API server
// calls its webhooks (and its CRDs' conversion webhook) by URL on
// 127.0.0.1, with a serving certificate for that address.
const (
	kueueNamespace = "kueue-system"
	// Kueue's internal certificate management keeps the certificate of
	// this Secret when it is valid for the Service's DNS name: the test
	// writes one that is also valid for 127.0.0.1, and Kueue puts it in
	// its cert directory and injects the CA into the webhook
	// configurations and the CRDs, as in a real install.
	kueueSecret      = "kueue-webhook-server-cert"
	kueueService     = "kueue-webhook-service"
	kueueQueueLabel  = "kueue.x-k8s.io/queue-name"
	kueueGroup       = "kueue.x-k8s.io"
	kueueAPI         = "v1beta2"
	kueueWebhookBase = "kueue"
)

var (
	clusterQueueGVR   = schema.GroupVersionResource{Group: kueueGroup, Version: kueueAPI, Resource: "clusterqueues"}
	localQueueGVR     = schema.GroupVersionResource{Group: kueueGroup, Version: kueueAPI, Resource: "localqueues"}
	resourceFlavorGVR = schema.GroupVersionResource{Group: kueueGroup, Version: kueueAPI, Resource: "resourceflavors"}
	workloadGVR       = schema.GroupVersionResource{Group: kueueGroup, Version: kueueAPI, Resource: "workloads"}
	crdGVR            = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	mutatingGVR       = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}
	validatingGVR     = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
)

// kueueConversionCRDs are the CRDs Kueue's kustomization gives a
// conversion webhook (config/components/crd/kustomization.yaml) and whose
// CA Kueue's certificate management injects; it waits for all of them.
var kueueConversionCRDs = []string{"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}

// kueueWebhookGroups are the API groups whose webhooks the test installs:
// Kueue's own objects, batch/v1 Jobs and plain pods (core, ""), the
// integrations enabled (a webhook of a disabled integration has no handler
// and, with failurePolicy Fail, would refuse its objects).
var kueueWebhookGroups = []string{kueueGroup, "batch", ""}

// kueuePodWebhookNamespaces is the namespaceSelector Kueue's kustomization
// (config/components/webhook/kustomization.yaml) gives its pod webhooks.
var kueuePodWebhookNamespaces = map[string]any{"matchExpressions": []any{map[string]any{
	"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": []any{"kube-system", kueueNamespace},
}}}

// kueueOptions configure startKueue.
type kueueOptions struct {
	cluster *localcluster.Cluster
	dir     string
	logDir  string
	// podsReadyTimeout is waitForPodsReady.timeout: how long an admitted
	// workload may take to have all of its pods Ready before Kueue evicts
	// it and gives its quota back.
	podsReadyTimeout time.Duration
	// requeueBaseSeconds is the base of the backoff before an evicted
	// workload is queued again.
	requeueBaseSeconds int
}

// kueueConfig is Kueue's Configuration for gpulink: quota on gpulink's
// whole-GPU DeviceClass counted as nvidia.com/gpu (the DRA mapping, Kueue's
// KEP 2941), waitForPodsReady so that a job gpulink cannot place gives its
// quota back, batch/v1 Jobs and plain pods. docs/kueue.md shows the same.
func kueueConfig(o kueueOptions, webhookPort, healthPort, metricsPort int, certDir string) string {
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
leaderElection:
  leaderElect: false
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: 127.0.0.1:%d
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
internalCertManagement:
  enable: true
  webhookServiceName: %s
  webhookSecretName: %s
integrations:
  frameworks:
  - batch/job
  - pod
waitForPodsReady:
  timeout: %s
  requeuingStrategy:
    timestamp: Eviction
    backoffBaseSeconds: %d
resources:
  deviceClassMappings:
  - name: nvidia.com/gpu
    deviceClassNames:
    - gpu.gpulink.dev
featureGates:
  DynamicResourceAllocation: true
  VisibilityOnDemand: false
`, kueueNamespace, healthPort, metricsPort, webhookPort, certDir, kueueService, kueueSecret,
		o.podsReadyTimeout, o.requeueBaseSeconds)
}

// kueueBinary returns the path of _output/bin/kueue (make kueue). It is
// missing on a machine that did not build it: the test skips there, but
// fails in CI, whose make test builds it.
func kueueBinary(t *testing.T) string {
	t.Helper()
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "kueue")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%v: make test builds Kueue (make kueue) before the e2e tests", err)
		}
		t.Skipf("no Kueue manager at %s: build it with `make kueue` (hack/kueue.sh) to run the Kueue e2e tests", bin)
	}
	return bin
}

// kueueModuleDir returns the directory of the pinned sigs.k8s.io/kueue
// module in the module cache (hack/kueue.sh --crds prints its CRD
// directory), where its CRDs and webhook manifests are read from.
func kueueModuleDir(ctx context.Context, t *testing.T) string {
	t.Helper()
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "kueue.sh"), "--crds")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/kueue.sh --crds: %v\n%s", err, stderr.String())
	}
	crds := strings.TrimSpace(string(out))
	return filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(crds))))
}

// startKueue installs Kueue's CRDs and webhooks on the cluster, runs its
// manager and returns once its Job webhook suspends a new Job.
func startKueue(ctx context.Context, t *testing.T, o kueueOptions) {
	t.Helper()
	bin := kueueBinary(t)
	start := time.Now()
	module := kueueModuleDir(ctx, t)
	dyn, err := dynamic.NewForConfig(o.cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	webhookPort := localcluster.FreePort(t)
	healthPort := localcluster.FreePort(t)
	metricsPort := localcluster.FreePort(t)
	webhookURL := fmt.Sprintf("https://127.0.0.1:%d", webhookPort)

	client := o.cluster.Client()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kueueNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret, err := kueueCertSecret()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Secrets(kueueNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installKueueCRDs(ctx, t, dyn, filepath.Join(module, "config", "components", "crd", "bases"), webhookURL)
	installKueueWebhooks(ctx, t, dyn, filepath.Join(module, "config", "components", "webhook", "manifests.yaml"), webhookURL)

	// The Secret's files in Kueue's cert directory, as the kubelet mounts
	// it into Kueue's pod: its certificate management waits for them.
	certDir := filepath.Join(o.dir, "kueue-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range secret.Data {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(o.dir, "kueue.yaml")
	if err := os.WriteFile(config, []byte(kueueConfig(o, webhookPort, healthPort, metricsPort, certDir)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := localcluster.StartBinary(t, o.logDir, "kueue", bin,
		"--config="+config, "--kubeconfig="+o.cluster.Kubeconfig(), "--zap-log-level=2")
	if err := p.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	waitKueueWebhook(ctx, t, p, client)
	t.Logf("Kueue (module %s) running with its CRDs and webhooks %.1fs after its install began", filepath.Base(module), time.Since(start).Seconds())
}

// waitKueueWebhook waits until the API server calls Kueue's Job webhook: a
// dry-run Job with a queue name comes back suspended.
func waitKueueWebhook(ctx context.Context, t *testing.T, p *localcluster.Binary, client kubernetes.Interface) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := p.Alive(); err != nil {
			return false, err
		}
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "kueue-probe", Labels: map[string]string{kueueQueueLabel: "probe"}},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			}}},
		}
		got, err := client.BatchV1().Jobs(metav1.NamespaceDefault).Create(ctx, job, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("dry-run Job came back with suspend %v", got.Spec.Suspend)
		return ptr.Deref(got.Spec.Suspend, false), nil
	})
	if err != nil {
		t.Fatalf("Kueue's Job webhook never took effect (last: %s): %v", last, err)
	}
}

// installKueueCRDs creates every CRD of Kueue's config/components/crd/bases
// with the conversion webhook its kustomization adds, by URL, and waits
// until they are established.
func installKueueCRDs(ctx context.Context, t *testing.T, dyn dynamic.Interface, dir, webhookURL string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Kueue CRDs in %s (%v)", dir, err)
	}
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := localcluster.DecodeObjects(raw)
		if err != nil || len(objs) != 1 || objs[0].GetKind() != "CustomResourceDefinition" {
			t.Fatalf("%s: want one CustomResourceDefinition, got %d objects (%v)", f, len(objs), err)
		}
		crd := objs[0]
		plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
		if slices.Contains(kueueConversionCRDs, plural) {
			conv := map[string]any{
				"strategy": "Webhook",
				"webhook": map[string]any{
					"clientConfig":             map[string]any{"url": webhookURL + "/convert"},
					"conversionReviewVersions": []any{"v1"},
				},
			}
			if err := unstructured.SetNestedMap(crd.Object, conv, "spec", "conversion"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating CRD %s: %v", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not established: %v", name, err)
		}
	}
}

// installKueueWebhooks creates Kueue's webhook configurations from its
// config/components/webhook/manifests.yaml under the names its
// certificate management injects the CA into, keeping the webhooks of
// kueueWebhookGroups, each calling the manager by URL.
func installKueueWebhooks(ctx context.Context, t *testing.T, dyn dynamic.Interface, manifest, webhookURL string) {
	t.Helper()
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeObjects(raw)
	if err != nil {
		t.Fatalf("%s: %v", manifest, err)
	}
	installed := 0
	for _, obj := range objs {
		var gvr schema.GroupVersionResource
		switch obj.GetKind() {
		case "MutatingWebhookConfiguration":
			gvr = mutatingGVR
			obj.SetName(kueueWebhookBase + "-mutating-webhook-configuration")
		case "ValidatingWebhookConfiguration":
			gvr = validatingGVR
			obj.SetName(kueueWebhookBase + "-validating-webhook-configuration")
		default:
			t.Fatalf("%s: unexpected %s", manifest, obj.GetKind())
		}
		hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
		var kept []any
		for _, h := range hooks {
			hook := h.(map[string]any)
			if !webhookForGroups(hook, kueueWebhookGroups) {
				continue
			}
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if path == "" {
				t.Fatalf("%s: webhook %v has no service path", manifest, hook["name"])
			}
			hook["clientConfig"] = map[string]any{"url": webhookURL + path}
			if hook["name"] == "mpod.kb.io" || hook["name"] == "vpod.kb.io" {
				hook["namespaceSelector"] = kueuePodWebhookNamespaces
			}
			kept = append(kept, hook)
		}
		if err := unstructured.SetNestedSlice(obj.Object, kept, "webhooks"); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		installed += len(kept)
	}
	if installed == 0 {
		t.Fatalf("%s: no webhook for %v", manifest, kueueWebhookGroups)
	}
}

// webhookForGroups tells whether every rule of the webhook is for one of
// the API groups.
func webhookForGroups(hook map[string]any, groups []string) bool {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	if len(rules) == 0 {
		return false
	}
	for _, r := range rules {
		gs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
		for _, g := range gs {
			if !slices.Contains(groups, g) {
				return false
			}
		}
	}
	return true
}

// kueueCertSecret returns the Secret Kueue's certificate management reads:
// a CA (named as Kueue names its CA, RSA keys in PKCS#1 as its rotator
// writes them) and a serving certificate for the webhook Service's DNS
// name, which the rotator checks, and for 127.0.0.1, which the API server
// calls.
func kueueCertSecret() (*corev1.Secret, error) {
	now := time.Now()
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generating Kueue's CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kueue-ca", Organization: []string{"kueue"}},
		DNSNames:              []string{"kueue-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing Kueue's CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generating Kueue's serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: kueueService + "." + kueueNamespace + ".svc"},
		DNSNames:     []string{kueueService + "." + kueueNamespace + ".svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing Kueue's serving certificate: %w", err)
	}
	pemOf := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: kueueSecret, Namespace: kueueNamespace},
		Data: map[string][]byte{
			"ca.crt":  pemOf("CERTIFICATE", caDER),
			"ca.key":  pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(caKey)),
			"tls.crt": pemOf("CERTIFICATE", der),
			"tls.key": pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)),
		},
	}, nil
}
