//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/test/localcluster"
)

// helmRelease is the release name the chart is installed as; its objects
// are named gpulink-kubelet-plugin, gpulink-controller.
const helmRelease = "gpulink"

// TestHelmInstallOnRealNode installs gpulink the way a user does: the image
// `make image` builds, imported into the real node's containerd, and
// `helm install` of deployments/helm/gpulink. The kubelet plugin runs as the
// chart's DaemonSet pod on the real node (topology-file discovery: no GPU
// here), the controller as the chart's Deployment with two replicas, with
// the chart's RBAC and admission policies.
func TestHelmInstallOnRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(binDir, "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("%v: build helm first (make helm)", err)
	}
	imageRef, imageTar, err := localcluster.BuildProductImage(ctx, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s (%s) in %.1fs", imageRef, imageTar, time.Since(begin).Seconds())

	dir, err := os.MkdirTemp("", "glhelm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("keeping %s for inspection", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	cluster, err := localcluster.Start(ctx, localcluster.Options{Dir: filepath.Join(dir, "c"), RealNode: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	if err := cluster.ImportImage(ctx, imageTar); err != nil {
		t.Fatal(err)
	}
	client := cluster.Client()
	node := cluster.NodeName()
	s := &suite{cluster: cluster, client: client, realNode: node}

	apiURL, err := url.Parse(cluster.RESTConfig().Host)
	if err != nil {
		t.Fatal(err)
	}
	topology, err := os.ReadFile(filepath.Join(root, "driver", "topology", "testdata", "pcie-nvbridge-8.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chartNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps(chartNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "gpulink-topology"},
		Data:       map[string]string{"topology.txt": string(topology)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A stand-in driver install: the chart's plugin puts its files into
	// the base CDI spec with nvcdi, and the containers must see them.
	driverRoot := filepath.Join(dir, "driver")
	// The chart mounts the driver root with HostToContainer propagation,
	// which needs a shared mount as on systemd hosts and under the GPU
	// Operator's /run/nvidia/driver; this VM's / is private.
	if err := os.MkdirAll(driverRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--bind", driverRoot, driverRoot}, {"--make-rshared", driverRoot}} {
		if out, err := exec.CommandContext(ctx, "mount", args...).CombinedOutput(); err != nil {
			t.Fatalf("mount %v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", driverRoot).Run() })
	// libcuda.so is the link the create-symlinks hook makes in the container.
	driverFiles := append(localcluster.WriteFakeDriver(t, driverRoot), "/usr/lib/x86_64-linux-gnu/libcuda.so")
	s.workloadEnv = []corev1.EnvVar{{Name: "GPULINK_WORKLOAD_FILES", Value: strings.Join(driverFiles, ",")}}
	kubeletRoot := cluster.KubeletRootDir()
	pluginDir := filepath.Join(kubeletRoot, "plugins", driver.Name)
	values := filepath.Join(dir, "values.yaml")
	// The local cluster has no pod network and no kube-proxy: the pods use
	// the host network and reach the API server on 127.0.0.1. The kubelet
	// root and the CDI directory live under the test directory.
	apiEnv := fmt.Sprintf(`
    - {name: KUBERNETES_SERVICE_HOST, value: %q}
    - {name: KUBERNETES_SERVICE_PORT, value: %q}`, apiURL.Hostname(), apiURL.Port())
	if err := os.WriteFile(values, []byte(fmt.Sprintf(`image:
  repository: %s
  tag: e2e
  pullPolicy: Never
kubeletPlugin:
  discovery: topology-file
  topologyConfigMap: gpulink-topology
  gpuProduct: NVIDIA A40
  gpuMemory: 48Gi
  driverRoot: %s
  kubeletRootDir: %s
  cdiRoot: %s
  mpsRoot: %s
  hostNetwork: true
  metricsPort: %d
  nodeSelector: {kubernetes.io/hostname: %s}
  extraEnv:%s
controller:
  replicas: 2
  hostNetwork: true
  metricsPort: 0
  healthPort: 0
  nodeSelector: {kubernetes.io/hostname: %s}
  extraEnv:%s
`, localcluster.ProductImageRepo, driverRoot, kubeletRoot, cluster.CDIDir(), filepath.Join(dir, "mps"), localcluster.FreePort(t), node, apiEnv, node, apiEnv)), 0o644); err != nil {
		t.Fatal(err)
	}
	runHelm := func(t *testing.T, args ...string) {
		t.Helper()
		args = append(args, "--kubeconfig", cluster.Kubeconfig(), "--namespace", chartNamespace)
		cmd := exec.CommandContext(ctx, helm, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	chart := filepath.Join(root, "deployments", "helm", "gpulink")
	runHelm(t, "install", helmRelease, chart, "--values", values)
	t.Logf("helm install done %.1fs after the start", time.Since(begin).Seconds())

	var plugin *corev1.Pod
	ok := t.Run("the DaemonSet's plugin registers and publishes the node's slices with its own identity", func(t *testing.T) {
		plugin = waitComponentPod(ctx, t, client, "kubelet-plugin", "")
		waitSlices(ctx, t, client, node, 8)
		checkSliceIdentity(ctx, t, client, cluster, plugin)
	}) && t.Run("one controller replica leads, the other waits on the lease", func(t *testing.T) {
		checkLeaderElection(ctx, t, client, cluster)
	})
	if !ok {
		return
	}
	var h holding
	ok = t.Run("a pod with a claim runs on the real node through the chart's plugin and controller", func(t *testing.T) {
		s.template(ctx, t, "helm-two", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 2}, nil)
		s.pod(ctx, t, "helm-two", "helm-two", node)
		h = s.waitBound(ctx, t, "helm-two")
		s.waitRunning(ctx, t, &h)
		if !strings.Contains(h.log, "NVIDIA_VISIBLE_DEVICES=") {
			t.Errorf("container has no NVIDIA_VISIBLE_DEVICES:\n%s", h.log)
		}
		// The driver files come from the base spec the DaemonSet's plugin
		// generated with nvcdi, the libcuda.so link from its create-symlinks
		// hook, which the container runtime ran with the nvidia-cdi-hook the
		// plugin copied from its image to the host.
		for _, f := range driverFiles {
			if !strings.Contains(h.log, "\nFILE "+f+"\n") {
				t.Errorf("container does not see driver file %s:\n%s", f, h.log)
			}
		}
	})
	if !ok {
		return
	}
	t.Run("helm upgrade rolls the plugin and keeps the prepared claim", func(t *testing.T) {
		runHelm(t, "upgrade", helmRelease, chart, "--values", values, "--set-string", "kubeletPlugin.podAnnotations.rollout=2")
		rolled := waitComponentPod(ctx, t, client, "kubelet-plugin", plugin.UID)
		t.Logf("plugin pod %s replaced by %s", plugin.Name, rolled.Name)
		waitSlices(ctx, t, client, node, 8)
		cp, err := kubeletplugin.NewCheckpointStore(pluginDir).Load()
		if err != nil {
			t.Fatalf("checkpoint after the upgrade: %v", err)
		}
		if pc := cp.Claims[h.claim.UID]; pc == nil || pc.State != kubeletplugin.PrepareCompleted {
			t.Fatalf("checkpoint after the upgrade lacks prepared claim %s: %+v", h.claim.UID, cp.Claims)
		}
		spec := filepath.Join(cluster.CDIDir(), driver.Name+"-claim_"+string(h.claim.UID)+".json")
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("CDI spec of the running pod's claim gone after the upgrade: %v", err)
		}
		// The new plugin unprepares what the old one prepared.
		if err := client.CoreV1().Pods(ns).Delete(ctx, h.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			_, err := os.Stat(spec)
			return os.IsNotExist(err), nil
		}); err != nil {
			t.Fatalf("CDI spec %s still there after the pod was deleted: %v", spec, err)
		}
	})
	t.Run("helm uninstall leaves no slices of the driver", func(t *testing.T) {
		runHelm(t, "uninstall", helmRelease, "--wait", "--timeout", "2m")
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, sl := range slices.Items {
				if sl.Spec.Driver == driver.Name {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("ResourceSlices of %s left after helm uninstall: %v", driver.Name, err)
		}
	})
	t.Logf("helm install e2e took %.1fs", time.Since(begin).Seconds())
}

// waitComponentPod waits until one pod of the chart's component runs and
// is ready, other than the pod with UID not (a rolled-over one).
func waitComponentPod(ctx context.Context, t *testing.T, client kubernetes.Interface, component string, not types.UID) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	var state string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
		if err != nil {
			return false, err
		}
		state = fmt.Sprintf("%d pods", len(pods.Items))
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.UID == not {
				continue
			}
			state += fmt.Sprintf("; %s %s", p.Name, p.Status.Phase)
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(p) {
				found = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no running %s pod: %s: %v", component, state, err)
	}
	return found
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitSlices waits until the node's pool publishes gpus devices.
func waitSlices(ctx context.Context, t *testing.T, client kubernetes.Interface, node string, gpus int) {
	t.Helper()
	var have int
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		have = 0
		for _, sl := range slices.Items {
			if sl.Spec.Driver == driver.Name && sl.Spec.NodeName != nil && *sl.Spec.NodeName == node {
				have += len(sl.Spec.Devices)
			}
		}
		return have == gpus, nil
	})
	if err != nil {
		t.Fatalf("node %s publishes %d devices, want %d: %v", node, have, gpus, err)
	}
}

// checkSliceIdentity acts as the plugin pod's service account, with a
// token bound to that pod as the kubelet gives it: the slice admission
// policy lets it write only its own node's pool.
func checkSliceIdentity(ctx context.Context, t *testing.T, client kubernetes.Interface, cluster *localcluster.Cluster, plugin *corev1.Pod) {
	t.Helper()
	tr, err := client.CoreV1().ServiceAccounts(chartNamespace).CreateToken(ctx, plugin.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: plugin.Name, UID: plugin.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cluster.RESTConfig())
	cfg.BearerToken = tr.Status.Token
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	own := cluster.NodeName()
	slice := func(name, nodeName, pool string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: driver.Name, NodeName: &nodeName,
				Pool:    resourceapi.ResourcePool{Name: pool, Generation: 99, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "gpu-0"}},
			},
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := as.ResourceV1().ResourceSlices().Create(ctx, slice("own-pool", own, own), dry); err != nil {
		t.Errorf("the plugin's identity may not write its own node's pool: %v", err)
	}
	for name, sl := range map[string]*resourceapi.ResourceSlice{
		"another node":               slice("other-node", "node-b", "node-b"),
		"another node's pool (name)": slice("shadow", own, "node-b"),
	} {
		_, err := as.ResourceV1().ResourceSlices().Create(ctx, sl, dry)
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("%s: the plugin's identity wrote a slice for node %q pool %q (err %v); want it refused", name, *sl.Spec.NodeName, sl.Spec.Pool.Name, err)
		}
	}
}

// checkLeaderElection checks that the Lease names one of the two running
// replicas and that only the leader starts deciding.
func checkLeaderElection(ctx context.Context, t *testing.T, client kubernetes.Interface, cluster *localcluster.Cluster) {
	t.Helper()
	var pods []corev1.Pod
	var holder string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=controller"})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				pods = append(pods, p)
			}
		}
		lease, err := client.CoordinationV1().Leases(chartNamespace).Get(ctx, helmRelease+"-controller", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		holder = ptr.Deref(lease.Spec.HolderIdentity, "")
		return len(pods) == 2 && holder != "", nil
	})
	if err != nil {
		t.Fatalf("want 2 running controller replicas and a lease holder; have %d, holder %q: %v", len(pods), holder, err)
	}
	leaders := 0
	for i := range pods {
		p := &pods[i]
		leads := strings.HasPrefix(holder, p.Name+"_")
		var log string
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			log, _ = localcluster.ReadPodLogFile(cluster.PodLogDir(), p, "controller")
			if leads {
				return strings.Contains(log, "Became leader"), nil
			}
			return strings.Contains(log, "Another instance leads"), nil
		})
		if err != nil {
			t.Errorf("controller pod %s (leader: %v) log does not show its role: %v\n%s", p.Name, leads, err, log)
		}
		if leads {
			leaders++
		} else if strings.Contains(log, "Became leader") {
			t.Errorf("controller pod %s is not the lease holder (%s) but logged that it leads", p.Name, holder)
		}
	}
	if leaders != 1 {
		t.Errorf("lease holder %q matches %d of the controller pods, want 1", holder, leaders)
	}
}
