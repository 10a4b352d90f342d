//go:build e2e

package conformance_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/compat/admission"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

// The real node as test/e2e presents it: 8 A40s in NVLink-bridged pairs.
const (
	realGPUs    = 8
	realFixture = "pcie-nvbridge-8.txt"
	realProduct = "NVIDIA A40"
	realMemory  = "48Gi"
	chartNS     = "gpulink-system"
)

// env is the local cluster with gpulink deployed the way a user runs it:
// the chart's DeviceClasses, scheduling-gate policy and translation
// webhook, the built controller (serving the webhook) and the real node's
// kubelet plugin.
type env struct {
	cluster  *localcluster.Cluster
	client   kubernetes.Interface
	node     string
	procs    []*localcluster.Binary
	stateDir string
	// devNodes: the stand-in /dev/nvidia* nodes exist, so containers see
	// their GPUs' device nodes.
	devNodes bool
}

// startEnv brings the cluster and gpulink up; everything stops at cleanup.
func startEnv(ctx context.Context, t *testing.T) *env {
	t.Helper()
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"gpulink-kubeletplugin", "gpulink-controller", "helm"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			t.Fatalf("%v: run `make build` and `hack/helm.sh --build` first", err)
		}
	}
	webhookPort := localcluster.FreePort(t)
	chart := renderChart(ctx, t, webhookPort)

	// Unix socket paths must stay below 108 bytes: keep the tree short.
	dir, err := localcluster.MkdirTemp("glconf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("keeping %s (component logs in c/logs, gpulink logs in logs)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	logDir := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Its stop is registered first, so it runs last: after the gpulink
	// processes stopped.
	cluster := localcluster.StartForTest(ctx, t, dir, localcluster.Options{RealNode: true})
	e := &env{cluster: cluster, client: cluster.Client(), node: cluster.NodeName(), stateDir: dir}
	if err := chart.InstallClusterScoped(ctx, e.client); err != nil {
		t.Fatal(err)
	}

	// The webhook's TLS and families come from the chart's Secret and
	// ConfigMap, as the chart mounts them into the controller.
	files := filepath.Join(dir, "webhook")
	if err := os.MkdirAll(files, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"tls.crt":     chart.secret.Data["tls.crt"],
		"tls.key":     chart.secret.Data["tls.key"],
		"compat.yaml": []byte(chart.config.Data["compat.yaml"]),
	} {
		if err := os.WriteFile(filepath.Join(files, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	driverRoot := filepath.Join(dir, "driver")
	e.devNodes = localcluster.MkDeviceNodes(t, driverRoot, realGPUs)
	pluginDir := filepath.Join(cluster.KubeletRootDir(), "plugins", driver.Name)
	registrar := filepath.Join(cluster.KubeletRootDir(), "plugins_registry")
	for _, d := range []string{registrar, pluginDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	plugin := localcluster.StartBinary(t, logDir, "kubeletplugin", filepath.Join(binDir, "gpulink-kubeletplugin"),
		"--node-name="+e.node,
		"--kubeconfig="+cluster.Kubeconfig(),
		"--discovery=topology-file",
		"--topology-file="+filepath.Join(root, "driver", "topology", "testdata", realFixture),
		"--gpu-product="+realProduct,
		"--gpu-memory="+realMemory,
		"--gpu-compute-capability=8.6",
		"--gpu-driver-version=550.90.07",
		"--kubelet-registrar-dir="+registrar,
		"--kubelet-plugin-dir="+pluginDir,
		"--cdi-root="+cluster.CDIDir(),
		"--mps-root="+filepath.Join(dir, "mps"),
		"--driver-root="+driverRoot,
		"--metrics-address=",
		"--v=2",
	)
	e.procs = append(e.procs, plugin)
	healthPort := localcluster.FreePort(t)
	ctrl := localcluster.StartBinary(t, logDir, "controller", filepath.Join(binDir, "gpulink-controller"),
		"--kubeconfig="+cluster.Kubeconfig(),
		"--leader-elect=false",
		fmt.Sprintf("--health-address=127.0.0.1:%d", healthPort),
		"--metrics-address=",
		fmt.Sprintf("--webhook-address=127.0.0.1:%d", webhookPort),
		"--webhook-cert-dir="+files,
		"--compat-config="+filepath.Join(files, "compat.yaml"),
		"--v=2",
	)
	e.procs = append(e.procs, ctrl)
	if err := gpuview.WaitDevices(ctx, e.client, e.node, realGPUs, plugin.Alive); err != nil {
		t.Fatal(err)
	}
	if err := ctrl.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &chart.webhook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAdmission(ctx, t)
	return e
}

// alive fails once a gpulink process has exited.
func (e *env) alive() error {
	for _, p := range e.procs {
		if err := p.Alive(); err != nil {
			return err
		}
	}
	return nil
}

// waitAdmission waits until the API server applies both admission steps
// (it picks policies and webhooks up asynchronously): a dry-run pod asking
// for nvidia.com/gpu comes back with a claim and gpulink's gate.
func (e *env) waitAdmission(ctx context.Context, t *testing.T) {
	t.Helper()
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-probe"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "probe", Image: localcluster.WorkloadImage,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": mustQuantity("1")}},
		}}},
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := e.client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("claims %d, gates %v", len(p.Spec.ResourceClaims), p.Spec.SchedulingGates)
		return len(p.Spec.ResourceClaims) == 1 && len(p.Spec.SchedulingGates) == 1, nil
	})
	if err != nil {
		t.Fatalf("the translation webhook and the gate policy never both took effect (last: %s): %v", last, err)
	}
}

// chartObjects are the objects of the chart the suite applies: the
// DeviceClasses, the scheduling-gate policy and the translation webhook
// (reached by URL: the local cluster has no kube-proxy).
type chartObjects struct {
	*localcluster.ChartObjects
	secret  corev1.Secret
	config  corev1.ConfigMap
	webhook admissionv1.MutatingWebhookConfiguration
}

// renderChart runs `helm template` as a user would, with the webhook at
// 127.0.0.1:port.
func renderChart(ctx context.Context, t *testing.T, port int) *chartObjects {
	t.Helper()
	out, err := localcluster.HelmTemplate(ctx, "gpulink", chartNS,
		"--show-only", "templates/deviceclasses.yaml",
		"--show-only", "templates/scheduling-gate.yaml",
		"--show-only", "templates/compat-webhook.yaml",
		"--set", fmt.Sprintf("compat.url=https://127.0.0.1:%d%s", port, admission.Path),
		"--set-json", `compat.tls.ipSANs=["127.0.0.1"]`)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeChart(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.DeviceClasses) == 0 || len(objs.Policies) != 1 || len(objs.Webhooks) != 1 || len(objs.Secrets) != 1 || len(objs.ConfigMaps) != 1 {
		t.Fatalf("chart rendering holds %d DeviceClasses, %d gate policies, %d webhooks, %d Secrets, %d ConfigMaps", len(objs.DeviceClasses), len(objs.Policies), len(objs.Webhooks), len(objs.Secrets), len(objs.ConfigMaps))
	}
	return &chartObjects{ChartObjects: objs, secret: objs.Secrets[0], config: objs.ConfigMaps[0], webhook: objs.Webhooks[0]}
}
