//go:build e2e

// Package e2e_test deploys gpulink the way a user runs it, as its built
// binaries (gpulink-kubeletplugin and gpulink-controller from `make build`,
// in localcluster.DefaultBinDir: $GPULINK_BIN_DIR, else _output/bin), on a
// local Kubernetes 1.37 cluster (test/localcluster):
//
//	local-node  real node (kubelet + containerd with CDI), presented by its
//	            kubelet plugin as 8 GPUs in NVLink-bridged pairs
//	            (pcie-nvbridge-8.txt); stand-in /dev/nvidia* device nodes
//	v100-node   API-only node, 8 x V100 hybrid cube mesh (v100-sxm2-8-aliyun-sccgn6.txt)
//	p40-node    API-only node, 7 x P40 on two PCIe switches (p40-pcie-7.txt)
//
// with one controller and the chart's cluster-scoped objects, rendered with
// `helm template` (<bin dir>/helm, from `hack/helm.sh --build`): the
// DeviceClasses (checked against deployments/deviceclasses) and the
// MutatingAdmissionPolicy that adds the scheduling gate to pods with claims.
// It checks what pods get: the container's NVIDIA_VISIBLE_DEVICES and
// /dev/nvidia* match the claim's allocation and the published UUIDs, the
// pair is the node's best, shares carry their MPS limits, pods never see
// each other's GPUs, the policy gates pods with claims and the controller
// lifts the gate, pods are bound to the allocated node, a pod the policy
// leaves ungated gets the best pair too, NVLink-required claims land on an NVLink quad or wait,
// link-minimal sets on the API-only nodes, and deleting pods removes the CDI
// specs and frees every device. The controller's and the real node's
// plugin's /metrics are scraped once for their metric names (and a few
// values), and `gpulink explain` (the built binary) must name the GPUs of a
// running pod.
//
// Needs root and the binaries of `hack/cluster.sh build`, `make build` and
// `hack/helm.sh --build` (the test runs the binaries as they are; rebuild
// after changing code):
//
//	make build && hack/helm.sh --build && go test -tags e2e -count=1 -v ./test/e2e/
//
// On failure the gpulink logs' tails are printed and the state directory
// (/tmp/gle2e*, component logs in c/logs, gpulink logs in logs) is kept.
package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

const (
	ns = metav1.NamespaceDefault
	// ungatedNS is excluded from the scheduling-gate policy.
	ungatedNS = "ungated"
	v100Node  = "v100-node"
	p40Node   = "p40-node"
	// Waits are generous: the machine running the tests may be slow and shared.
	allocTimeout = 3 * time.Minute
	runTimeout   = 3 * time.Minute
)

// nodeSpec is one GPU node of the test cluster and its kubelet plugin.
type nodeSpec struct {
	name, fixture, product, memory, cc string
	gpus                               int
}

type suite struct {
	cluster    *localcluster.Cluster
	client     kubernetes.Interface
	realNode   string
	mpsRoot    string
	devNodes   bool
	controller *localcluster.Binary
	plugins    []*localcluster.Binary
	// controllerMetrics and pluginMetrics are the /metrics URLs of the
	// controller and of the real node's kubelet plugin.
	controllerMetrics, pluginMetrics string
	// workloadEnv is added to every workload container.
	workloadEnv []corev1.EnvVar
	// realPluginDir is the real node's plugin directory (its injected
	// health events file is there); realPluginHTTP is the base URL of
	// that plugin's metrics and liveness endpoints.
	realPluginDir  string
	realPluginHTTP string
}

func TestE2E(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := setup(ctx, t)
	t.Logf("gpulink deployed %.1fs after the start", time.Since(begin).Seconds())

	var first, share holding
	ok := t.Run("two GPUs through a claim template run on the real node with the best pair", func(t *testing.T) {
		first = s.twoGPUPod(ctx, t, "two-gpus")
	}) && t.Run("the controller and the plugin expose their metrics; gpulink explain names the pod's GPUs", func(t *testing.T) {
		s.checkMetrics(ctx, t, first)
		s.checkExplain(ctx, t, first)
	}) && t.Run("a share shows its MPS limits", func(t *testing.T) {
		share = s.sharePod(ctx, t, first)
	}) && t.Run("a second whole-GPU pod never sees the first pod's GPUs", func(t *testing.T) {
		s.secondPod(ctx, t, first, share)
	})
	if ok {
		t.Run("four GPUs with NVLink required land on an NVLink quad of the V100 node", func(t *testing.T) {
			s.nvlinkQuad(ctx, t)
		})
		t.Run("four GPUs with NVLink required wait on a node without NVLink", func(t *testing.T) {
			s.requiredWaits(ctx, t)
		})
		t.Run("four GPUs on the P40 node share one PCIe switch", func(t *testing.T) {
			s.p40Quad(ctx, t)
		})
		t.Run("a pod the gate policy leaves alone gets the best free pair too", func(t *testing.T) {
			s.ungatedPair(ctx, t)
		})

	}
	t.Run("deleting the pods removes the CDI specs and frees every device", func(t *testing.T) {
		s.cleanupFreesDevices(ctx, t)
	})
	t.Logf("e2e took %.1fs", time.Since(begin).Seconds())
}

// setup starts the cluster, applies the chart's DeviceClasses and
// scheduling-gate policy and waits until the policy is in effect, then
// starts the kubelet plugins and the controller.
func setup(ctx context.Context, t *testing.T) *suite {
	return setupWith(ctx, t)
}

// setupWith is setup with extra controller flags.
func setupWith(ctx context.Context, t *testing.T, controllerArgs ...string) *suite {
	return setupOpts(ctx, t, setupOptions{controllerArgs: controllerArgs})
}

// setupOptions are extra flags for the gpulink processes of a suite.
type setupOptions struct {
	controllerArgs []string
	// realPluginArgs are added to the real node's kubelet plugin.
	realPluginArgs []string
	// mpsDevicePlugin makes the real node's plugin serve the MPS daemon
	// device plugin to its kubelet (simulated GPUs do not by default).
	mpsDevicePlugin bool
	// realDevices, when not zero, is how many devices the real node
	// publishes (realPluginArgs may change its GPUs); migCapMinors are
	// the /dev/nvidia-caps stand-ins its MIG devices need.
	realDevices  int
	migCapMinors []int
	// workloadGatesOff runs the cluster without the Workload API
	// (localcluster.WorkloadGates off).
	workloadGatesOff bool
}

// setupOpts is setup with extra flags.
func setupOpts(ctx context.Context, t *testing.T, o setupOptions) *suite {
	controllerArgs := o.controllerArgs
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	pluginBin := filepath.Join(binDir, "gpulink-kubeletplugin")
	controllerBin := filepath.Join(binDir, "gpulink-controller")
	for _, b := range []string{pluginBin, controllerBin} {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%v: run `make build` first", err)
		}
	}
	// The chart's cluster-scoped objects, as `helm template` renders them
	// for a user (rendered before the cluster starts, to fail fast): the
	// DeviceClasses and the MutatingAdmissionPolicy that gates pods with
	// claims. Its namespaceSelector leaves out namespaces labelled
	// ungatedLabel=ungatedValue, where the test runs a pod without the gate.
	chart, err := renderChart(ctx, "--set-json",
		fmt.Sprintf(`gate.namespaceSelector={"matchExpressions":[{"key":%q,"operator":"NotIn","values":[%q]}]}`, ungatedLabel, ungatedValue))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := readDeviceClasses(filepath.Join(root, "deployments", "deviceclasses", "deviceclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sameDeviceClasses(chart.DeviceClasses, manifest); err != nil {
		t.Fatalf("the chart's DeviceClasses differ from deployments/deviceclasses/deviceclasses.yaml: %v", err)
	}
	// Unix socket paths must stay below 108 bytes: keep the tree short.
	dir, logDir := testDir(t, "gle2e", "component logs in c/logs, gpulink logs in logs")
	// Its stop is registered first, so it runs last: after the gpulink
	// processes stopped.
	copts := localcluster.Options{RealNode: true}
	if o.workloadGatesOff {
		copts.FeatureGates = map[string]bool{}
		for gate := range localcluster.WorkloadGates {
			copts.FeatureGates[gate] = false
		}
	}
	cluster := localcluster.StartForTest(ctx, t, dir, copts)
	s := &suite{cluster: cluster, client: cluster.Client(), realNode: cluster.NodeName(), mpsRoot: filepath.Join(dir, "mps")}
	for _, n := range []string{v100Node, p40Node} {
		if err := cluster.AddAPINode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	policyStart := time.Now()
	if err := chart.InstallClusterScoped(ctx, s.client); err != nil {
		t.Fatal(err)
	}
	if err := ungatedNamespace(ctx, s.client, ungatedNS); err != nil {
		t.Fatal(err)
	}
	if err := waitGatePolicy(ctx, s.client, ns); err != nil {
		t.Fatal(err)
	}
	probe, err := s.client.CoreV1().Pods(ungatedNS).Create(ctx, probePod(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run pod in namespace %s: %v", ungatedNS, err)
	}
	if gated(probe) != 0 {
		t.Fatalf("dry-run pod in namespace %s got gates %v; the policy's namespaceSelector should leave it alone", ungatedNS, probe.Spec.SchedulingGates)
	}
	t.Logf("chart objects applied: %d DeviceClasses; the scheduling-gate policy took effect after %.1fs",
		len(chart.DeviceClasses), time.Since(policyStart).Seconds())

	driverRoot := filepath.Join(dir, "driver")
	s.devNodes = localcluster.MkDeviceNodes(t, driverRoot, 8)
	if len(o.migCapMinors) > 0 {
		s.devNodes = localcluster.MkMIGCapNodes(t, driverRoot, o.migCapMinors...) && s.devNodes
	}
	testdata := filepath.Join(root, "driver", "topology", "testdata")
	realDevices := 8
	if o.realDevices > 0 {
		realDevices = o.realDevices
	}
	nodes := []nodeSpec{
		{s.realNode, "pcie-nvbridge-8.txt", "NVIDIA A40", "48Gi", "8.6", realDevices},
		{v100Node, "v100-sxm2-8-aliyun-sccgn6.txt", "Tesla V100-SXM2-16GB", "16Gi", "7.0", 8},
		{p40Node, "p40-pcie-7.txt", "Tesla P40", "24Gi", "6.1", 7},
	}
	for _, n := range nodes {
		registrar := filepath.Join(dir, "n", n.name, "registry")
		pluginDir := filepath.Join(dir, "n", n.name, "plugin")
		cdiRoot := filepath.Join(dir, "n", n.name, "cdi")
		mpsRoot := filepath.Join(dir, "n", n.name, "mps")
		metricsAddress := ""
		if n.name == s.realNode {
			registrar = filepath.Join(cluster.KubeletRootDir(), "plugins_registry")
			pluginDir = filepath.Join(cluster.KubeletRootDir(), "plugins", driver.Name)
			cdiRoot = cluster.CDIDir()
			mpsRoot = s.mpsRoot
			metricsAddress = fmt.Sprintf("127.0.0.1:%d", localcluster.FreePort(t))
			s.realPluginDir, s.realPluginHTTP = pluginDir, "http://"+metricsAddress
			s.pluginMetrics = s.realPluginHTTP + "/metrics"
		}
		// The kubelet creates these on a real node; nothing does on an API-only one.
		for _, d := range []string{registrar, pluginDir} {
			if err := os.MkdirAll(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}
		args := []string{
			"--node-name=" + n.name,
			"--kubeconfig=" + cluster.Kubeconfig(),
			"--discovery=topology-file",
			"--topology-file=" + filepath.Join(testdata, n.fixture),
			"--gpu-product=" + n.product,
			"--gpu-memory=" + n.memory,
			"--gpu-compute-capability=" + n.cc,
			"--gpu-driver-version=550.90.07",
			"--kubelet-registrar-dir=" + registrar,
			"--kubelet-plugin-dir=" + pluginDir,
			"--cdi-root=" + cdiRoot,
			"--mps-root=" + mpsRoot,
			"--driver-root=" + driverRoot,
			"--metrics-address=" + metricsAddress,
			"--v=2",
		}
		if n.name == s.realNode {
			args = append(args, o.realPluginArgs...)
			if o.mpsDevicePlugin {
				// The kubelet's device plugin directory is fixed,
				// whatever its --root-dir: the plugin's default.
				args = append(args, "--mps-device-plugin")
			}
		}
		p := localcluster.StartBinary(t, logDir, "kubeletplugin-"+n.name, pluginBin, args...)
		s.plugins = append(s.plugins, p)
		if err := gpuview.WaitDevices(ctx, s.client, n.name, n.gpus, p.Alive); err != nil {
			t.Fatal(err)
		}
	}
	healthPort := localcluster.FreePort(t)
	metricsPort := localcluster.FreePort(t)
	s.controllerMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	s.controller = localcluster.StartBinary(t, logDir, "controller", controllerBin, append([]string{
		"--kubeconfig=" + cluster.Kubeconfig(),
		"--leader-elect=false",
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", metricsPort),
		fmt.Sprintf("--health-address=127.0.0.1:%d", healthPort),
		"--v=2",
	}, controllerArgs...)...)
	if err := s.controller.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return s
}

// alive fails when a gpulink process has exited.
func (s *suite) alive() error {
	for _, p := range append([]*localcluster.Binary{s.controller}, s.plugins...) {
		if p == nil {
			continue // the chart runs it as a pod
		}
		if err := p.Alive(); err != nil {
			return err
		}
	}
	return nil
}

// template creates a ResourceClaimTemplate with one request "gpus".
func (s *suite) template(ctx context.Context, t *testing.T, name string, req resourceapi.ExactDeviceRequest, config *resourceapi.DeviceClaimConfiguration) {
	t.Helper()
	s.templateIn(ctx, t, ns, name, req, config)
}

// templateIn is template in namespace.
func (s *suite) templateIn(ctx context.Context, t *testing.T, namespace, name string, req resourceapi.ExactDeviceRequest, config *resourceapi.DeviceClaimConfiguration) {
	t.Helper()
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &req}},
	}}
	if config != nil {
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{*config}
	}
	_, err := s.client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating ResourceClaimTemplate %s: %v", name, err)
	}
}

// pod creates a workload pod using a claim from the template, on node when
// it is not empty. The pod has no scheduling gate of its own: it checks that
// the chart's admission policy added gpulink's gate at creation.
func (s *suite) pod(ctx context.Context, t *testing.T, name, template, node string) *corev1.Pod {
	t.Helper()
	created := s.createPod(ctx, t, ns, name, template, node)
	if n := gated(created); n != 1 {
		t.Fatalf("pod %s was created with gates %v; want the admission policy to add %s once", name, created.Spec.SchedulingGates, driver.SchedulingGate)
	}
	return created
}

// createPod creates the workload pod of pod in namespace as it is.
func (s *suite) createPod(ctx context.Context, t *testing.T, namespace, name, template, node string) *corev1.Pod {
	t.Helper()
	return s.createLabelledPod(ctx, t, namespace, name, template, node, nil)
}

// createLabelledPod is createPod with labels of its own beside the
// workload's (a gang's, say), which must be there when the pod is created.
func (s *suite) createLabelledPod(ctx context.Context, t *testing.T, namespace, name, template, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	podLabels := map[string]string{"app": "gpulink-e2e"}
	for k, v := range labels {
		podLabels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: podLabels},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &template}},
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           localcluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
				Env:             s.workloadEnv,
			}},
		},
	}
	if node != "" {
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	created, err := s.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// holding is what a pod got.
type holding struct {
	pod   *corev1.Pod
	claim *resourceapi.ResourceClaim
	gpuview.Holding
	log string
}

// waitBound waits until the controller allocated the pod's claim and
// removed the scheduling gate and kube-scheduler bound the pod, then checks
// that the claim is reserved for the pod and names the pod's node.
func (s *suite) waitBound(ctx context.Context, t *testing.T, name string) holding {
	t.Helper()
	return s.waitBoundIn(ctx, t, ns, name)
}

// waitBoundIn is waitBound in namespace.
func (s *suite) waitBoundIn(ctx context.Context, t *testing.T, namespace, name string) holding {
	t.Helper()
	var h holding
	var state string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, allocTimeout, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		pod, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		h.pod = pod
		if len(pod.Status.ResourceClaimStatuses) == 0 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			state = "claim not created yet"
			return false, nil
		}
		claim, err := s.client.ResourceV1().ResourceClaims(namespace).Get(ctx, *pod.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		h.claim = claim
		held, allocated, err := gpuview.ClaimDevices(claim)
		if err != nil {
			return false, err
		}
		h.Holding = held
		switch {
		case !allocated:
			state = "claim " + claim.Name + " not allocated"
		case len(pod.Spec.SchedulingGates) > 0:
			state = fmt.Sprintf("claim allocated, pod still gated %v", pod.Spec.SchedulingGates)
		case pod.Spec.NodeName == "":
			state = "gate removed, pod not bound yet"
		default:
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s: %s: %v\n%s", name, state, err, describePod(ctx, s.client, namespace, name))
	}
	if h.pod.Spec.NodeName != h.Node {
		t.Errorf("pod %s bound to %s, its claim's devices are on %s", name, h.pod.Spec.NodeName, h.Node)
	}
	if sel := h.claim.Status.Allocation.NodeSelector; !selectsOnly(sel, h.Node) {
		t.Errorf("claim %s: allocation node selector %v does not name node %s", h.claim.Name, sel, h.Node)
	}
	if !slices.ContainsFunc(h.claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
		return r.Resource == "pods" && r.Name == name && r.UID == h.pod.UID
	}) {
		t.Errorf("claim %s reservedFor %+v lacks pod %s", h.claim.Name, h.claim.Status.ReservedFor, name)
	}
	t.Logf("pod %s: claim %s allocated %s on %s, pod ungated and bound", name, h.claim.Name, gpuview.Indexes(h.Devices), h.Node)
	return h
}

// waitRunning waits until the pod (in its namespace) runs and its
// workload printed READY.
func (s *suite) waitRunning(ctx context.Context, t *testing.T, h *holding) {
	t.Helper()
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, runTimeout, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		pod, err := s.client.CoreV1().Pods(h.pod.Namespace).Get(ctx, h.pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		h.pod = pod
		if pod.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		log, err := podLog(ctx, s.cluster, pod)
		if err != nil {
			lastErr = err
			return false, nil
		}
		h.log = log
		return strings.Contains(log, "\nREADY"), nil
	})
	if err == nil {
		var seen []string
		for _, l := range strings.Split(h.log, "\n") {
			if strings.HasPrefix(l, "DEV ") || strings.Contains(l, "NVIDIA") || strings.Contains(l, "CUDA") || strings.Contains(l, "GPULINK") {
				seen = append(seen, "  "+l)
			}
		}
		t.Logf("pod %s runs; its container sees:\n%s", h.pod.Name, strings.Join(seen, "\n"))
	}
	if err != nil {
		t.Fatalf("pod %s never printed READY: %v (last log error: %v)\nlog so far:\n%s\n%s", h.pod.Name, err, lastErr, h.log, describePod(ctx, s.client, h.pod.Namespace, h.pod.Name))
	}
}

// nodes reads the published topology of every node.
func (s *suite) nodes(ctx context.Context, t *testing.T) map[string]*gpuview.Node {
	t.Helper()
	nodes, err := gpuview.Nodes(ctx, s.client)
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// checkDevices checks that the container sees exactly the claim's GPUs:
// NVIDIA_VISIBLE_DEVICES holds their UUIDs (from the ResourceSlices) and
// /dev holds their device nodes and no other GPU's.
func (s *suite) checkDevices(t *testing.T, node *gpuview.Node, h holding) {
	t.Helper()
	if len(lines(h.log, "ENV NVIDIA_VISIBLE_DEVICES=")) != 1 {
		t.Fatalf("pod %s: want one NVIDIA_VISIBLE_DEVICES, log:\n%s", h.pod.Name, h.log)
	}
	visible, _ := env(h.log, "NVIDIA_VISIBLE_DEVICES")
	got := strings.Split(visible, ",")
	want := node.UUIDs(h.Devices)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES=%s, want the UUIDs of %s: %v", h.pod.Name, visible, gpuview.Indexes(h.Devices), want)
	}
	if v, _ := env(h.log, "CUDA_DEVICE_ORDER"); v != "PCI_BUS_ID" {
		t.Errorf("pod %s: CUDA_DEVICE_ORDER=%q, want PCI_BUS_ID", h.pod.Name, v)
	}
	if !s.devNodes {
		return
	}
	wantDev := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}
	for _, d := range h.Devices {
		g, _ := node.GPU(d)
		wantDev = append(wantDev, fmt.Sprintf("/dev/nvidia%d", g.Minor))
	}
	gotDev := lines(h.log, "DEV ")
	sort.Strings(wantDev)
	sort.Strings(gotDev)
	if !slices.Equal(gotDev, wantDev) {
		t.Errorf("pod %s: /dev entries %v, want %v", h.pod.Name, gotDev, wantDev)
	}
}

func (s *suite) twoGPUPod(ctx context.Context, t *testing.T, name string) holding {
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 2}, nil)
	s.pod(ctx, t, name, name, s.realNode)
	h := s.waitBound(ctx, t, name)
	if h.Node != s.realNode || len(h.Devices) != 2 || len(h.Shares) != 0 {
		t.Fatalf("claim %s holds %v (shares %d) on %s, want 2 whole GPUs on %s", h.claim.Name, h.Devices, len(h.Shares), h.Node, s.realNode)
	}
	node := s.nodes(ctx, t)[s.realNode]
	weakest, err := node.Weakest(h.Devices)
	if err != nil {
		t.Fatal(err)
	}
	if best := node.BestWeakest(2, nil); weakest != best {
		t.Errorf("pair %s is linked by %s, the node's best pair by %s", gpuview.Indexes(h.Devices), weakest, best)
	}
	if !weakest.IsNVLink() {
		t.Errorf("pair %s is linked by %s, want an NVLink bridge", gpuview.Indexes(h.Devices), weakest)
	}
	s.waitRunning(ctx, t, &h)
	s.checkDevices(t, node, h)
	return h
}

func (s *suite) sharePod(ctx context.Context, t *testing.T, first holding) holding {
	const name = "share"
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassShare,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			driver.CapacityMemory: resource.MustParse("6Gi"),
			driver.CapacityCores:  resource.MustParse("30"),
		}},
	}, nil)
	s.pod(ctx, t, name, name, s.realNode)
	h := s.waitBound(ctx, t, name)
	if h.Node != s.realNode || len(h.Devices) != 1 || len(h.Shares) != 1 {
		t.Fatalf("claim %s holds %v (shares %d) on %s, want one share on %s", h.claim.Name, h.Devices, len(h.Shares), h.Node, s.realNode)
	}
	if slices.Contains(first.Devices, h.Devices[0]) {
		t.Errorf("share on %s, which pod %s holds whole", h.Devices[0], first.pod.Name)
	}
	r := h.Shares[0]
	if mem, cores := r.ConsumedCapacity[driver.CapacityMemory], r.ConsumedCapacity[driver.CapacityCores]; mem.Cmp(resource.MustParse("6Gi")) != 0 || cores.Cmp(resource.MustParse("30")) != 0 {
		t.Errorf("share consumed memory %s cores %s, want 6Gi and 30", mem.String(), cores.String())
	}
	s.waitRunning(ctx, t, &h)
	node := s.nodes(ctx, t)[s.realNode]
	s.checkDevices(t, node, h)
	// Each MPS claim has its own daemon, pipe directory and /dev/shm.
	for k, want := range map[string]string{
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=6144M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
		"CUDA_MPS_PIPE_DIRECTORY":           filepath.Join(s.mpsRoot, string(h.claim.UID), "pipe"),
	} {
		if got, ok := env(h.log, k); !ok || got != want {
			t.Errorf("pod %s: %s=%q (set: %t), want %q", name, k, got, ok, want)
		}
	}
	return h
}

// selectsOnly reports whether the node selector names exactly node.
func selectsOnly(sel *corev1.NodeSelector, node string) bool {
	if sel == nil || len(sel.NodeSelectorTerms) != 1 {
		return false
	}
	var values []string
	for _, r := range sel.NodeSelectorTerms[0].MatchFields {
		values = append(values, r.Values...)
	}
	for _, r := range sel.NodeSelectorTerms[0].MatchExpressions {
		values = append(values, r.Values...)
	}
	return slices.Equal(values, []string{node})
}

func (s *suite) secondPod(ctx context.Context, t *testing.T, first, share holding) {
	const name = "two-more-gpus"
	nodes := s.nodes(ctx, t)
	node := nodes[s.realNode]
	free := map[string]bool{}
	for _, g := range node.GPUs {
		free[g.Device] = !slices.Contains(first.Devices, g.Device) && !slices.Contains(share.Devices, g.Device)
	}
	best := node.BestWeakest(2, free)
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 2}, nil)
	s.pod(ctx, t, name, name, s.realNode)
	h := s.waitBound(ctx, t, name)
	if h.Node != s.realNode || len(h.Devices) != 2 {
		t.Fatalf("claim %s holds %v on %s, want 2 GPUs on %s", h.claim.Name, h.Devices, h.Node, s.realNode)
	}
	for _, d := range h.Devices {
		if !free[d] {
			t.Errorf("pod %s got %s, held by pod %s or %s", name, d, first.pod.Name, share.pod.Name)
		}
	}
	if w, _ := node.Weakest(h.Devices); w != best {
		t.Errorf("pair %s is linked by %s, the best free pair by %s", gpuview.Indexes(h.Devices), w, best)
	}
	s.waitRunning(ctx, t, &h)
	s.checkDevices(t, node, h)
	visible, _ := env(h.log, "NVIDIA_VISIBLE_DEVICES")
	for _, u := range node.UUIDs(append(slices.Clone(first.Devices), share.Devices...)) {
		if strings.Contains(visible, u) {
			t.Errorf("pod %s sees %s of another pod (NVIDIA_VISIBLE_DEVICES=%s)", name, u, visible)
		}
	}
}

// requireNVLink is the claim configuration of a request "gpus" whose
// devices must all be NVLink-connected (topology policy Required).
func requireNVLink() *resourceapi.DeviceClaimConfiguration {
	return &resourceapi.DeviceClaimConfiguration{
		Requests: []string{"gpus"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig",` +
				`"topology":{"policy":"Required","minLink":"NVLink"}}`)},
		}},
	}
}

func (s *suite) nvlinkQuad(ctx context.Context, t *testing.T) {
	const name = "four-nvlink"
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 4}, requireNVLink())
	// No node selector: only the V100 node has four GPUs that are all
	// NVLink-connected (the real node has NVLink pairs, the P40 node none).
	s.pod(ctx, t, name, name, "")
	h := s.waitBound(ctx, t, name)
	if h.Node != v100Node || len(h.Devices) != 4 {
		t.Fatalf("claim %s holds %v on %s, want 4 GPUs on %s", h.claim.Name, h.Devices, h.Node, v100Node)
	}
	node := s.nodes(ctx, t)[v100Node]
	w, _ := node.Weakest(h.Devices)
	if !w.IsNVLink() {
		t.Errorf("quad %s has a pair linked by %s, want every pair NVLink", gpuview.Indexes(h.Devices), w)
	}
	if got := gpuview.Indexes(h.Devices); got != "0,1,2,3" && got != "4,5,6,7" {
		t.Errorf("quad %s, want 0,1,2,3 or 4,5,6,7 (the hybrid cube mesh's NVLink quads)", got)
	}
}

func (s *suite) p40Quad(ctx context.Context, t *testing.T) {
	const name = "four-p40"
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 4}, nil)
	s.pod(ctx, t, name, name, p40Node)
	h := s.waitBound(ctx, t, name)
	if h.Node != p40Node || len(h.Devices) != 4 {
		t.Fatalf("claim %s holds %v on %s, want 4 GPUs on %s", h.claim.Name, h.Devices, h.Node, p40Node)
	}
	node := s.nodes(ctx, t)[p40Node]
	w, _ := node.Weakest(h.Devices)
	if w != topology.LinkPIX {
		// First fit (GPUs 0-3) would cross the host bridge (PHB).
		t.Errorf("quad %s is linked by %s, want PIX (GPUs 3-6 behind one switch)", gpuview.Indexes(h.Devices), w)
	}
}

func (s *suite) ungatedPair(ctx context.Context, t *testing.T) {
	const name = "ungated-pair"
	node := s.nodes(ctx, t)[v100Node]
	free := s.free(ctx, t, node)
	best := node.BestWeakest(2, free)
	s.templateIn(ctx, t, ungatedNS, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 2}, nil)
	// The policy's namespaceSelector excludes this namespace, so the pod is
	// created without the gate. kube-scheduler sees it at once and finds its
	// claim unallocated and every device tainted for the controller; it
	// binds the pod once the controller has allocated the claim.
	if pod := s.createPod(ctx, t, ungatedNS, name, name, v100Node); len(pod.Spec.SchedulingGates) != 0 {
		t.Fatalf("pod %s/%s was created with gates %v; the policy's namespaceSelector should leave it alone", ungatedNS, name, pod.Spec.SchedulingGates)
	}
	h := s.waitBoundIn(ctx, t, ungatedNS, name)
	if h.Node != v100Node || len(h.Devices) != 2 {
		t.Fatalf("claim %s holds %v on %s, want 2 GPUs on %s", h.claim.Name, h.Devices, h.Node, v100Node)
	}
	for _, d := range h.Devices {
		if !free[d] {
			t.Errorf("pod %s got %s, which another claim holds", name, d)
		}
	}
	if w, _ := node.Weakest(h.Devices); w != best {
		t.Errorf("pair %s is linked by %s, the best free pair by %s", gpuview.Indexes(h.Devices), w, best)
	}
}

// free returns the node's devices that no claim in the cluster holds.
func (s *suite) free(ctx context.Context, t *testing.T, node *gpuview.Node) map[string]bool {
	t.Helper()
	claims, err := s.client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	free := map[string]bool{}
	for _, g := range node.GPUs {
		free[g.Device] = true
	}
	for i := range claims.Items {
		h, ok, err := gpuview.ClaimDevices(&claims.Items[i])
		if err != nil {
			t.Fatal(err)
		}
		if ok && h.Node == node.Name {
			for _, d := range h.Devices {
				free[d] = false
			}
		}
	}
	return free
}

// requiredWaits: a claim for four NVLink-connected GPUs (policy Required)
// pinned to the P40 node, which has seven free GPUs but no NVLink, is not
// given anything worse; the pod stays gated and the controller says why.
func (s *suite) requiredWaits(ctx context.Context, t *testing.T) {
	const name = "four-nvlink-waits"
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 4}, requireNVLink())
	pod := s.pod(ctx, t, name, name, p40Node)
	var note string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, allocTimeout, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		events, err := s.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.UID == pod.UID && e.Reason == report.ReasonWaiting {
				note = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event for pod %s: %v\n%s", report.ReasonWaiting, name, err, describePod(ctx, s.client, ns, name))
	}
	t.Logf("pod %s waits: %s", name, note)
	got, err := s.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" || !slices.ContainsFunc(got.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == driver.SchedulingGate }) {
		t.Errorf("pod %s: node %q, gates %v; want it gated and unbound", name, got.Spec.NodeName, got.Spec.SchedulingGates)
	}
	for _, st := range got.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			continue
		}
		c, err := s.client.ResourceV1().ResourceClaims(ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation != nil {
			t.Errorf("claim %s allocated %+v, want it unallocated", c.Name, c.Status.Allocation.Devices.Results)
		}
	}
}

// cleanupFreesDevices deletes every pod, waits until the CDI specs and the
// claims are gone, then proves that the real node's eight GPUs are all free
// by running a pod that takes them all.
func (s *suite) cleanupFreesDevices(ctx context.Context, t *testing.T) {
	s.deletePodsAndWait(ctx, t)
	const name = "all-eight"
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 8}, nil)
	s.pod(ctx, t, name, name, s.realNode)
	h := s.waitBound(ctx, t, name)
	if h.Node != s.realNode || len(h.Devices) != 8 {
		t.Fatalf("claim %s holds %v on %s, want all 8 GPUs of %s", h.claim.Name, h.Devices, h.Node, s.realNode)
	}
	s.waitRunning(ctx, t, &h)
	s.checkDevices(t, s.nodes(ctx, t)[s.realNode], h)
	s.deletePodsAndWait(ctx, t)
}

func (s *suite) deletePodsAndWait(ctx context.Context, t *testing.T) {
	t.Helper()
	pods := s.client.CoreV1().Pods(ns)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: "app=gpulink-e2e"}); err != nil {
		t.Fatalf("deleting pods: %v", err)
	}
	var state string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=gpulink-e2e"})
		if err != nil {
			return false, err
		}
		if len(list.Items) > 0 {
			state = fmt.Sprintf("%d pods left", len(list.Items))
			return false, nil
		}
		entries, err := os.ReadDir(s.cluster.CDIDir())
		if err != nil {
			return false, err
		}
		var specs []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), driver.Name+"-claim_") {
				specs = append(specs, e.Name())
			}
		}
		if len(specs) > 0 {
			state = fmt.Sprintf("CDI specs left: %v", specs)
			return false, nil
		}
		claims, err := s.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(claims.Items) > 0 {
			var left []string
			for _, c := range claims.Items {
				left = append(left, fmt.Sprintf("%s (allocated %t, reserved %d, finalizers %v)", c.Name, c.Status.Allocation != nil, len(c.Status.ReservedFor), c.Finalizers))
			}
			state = "claims left: " + strings.Join(left, ", ")
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("after deleting the pods: %s: %v", state, err)
	}
	// The templates are the test's own; the next phase creates new ones.
	// Those the translation webhook created are left to its collector.
	if err := s.client.ResourceV1().ResourceClaimTemplates(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "!" + compat.LabelManaged}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting claim templates: %v", err)
	}
}
