//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

// helmRelease is the release name the chart is installed as; its objects
// are named gpulink-kubelet-plugin, gpulink-controller.
const helmRelease = "gpulink"

// TestHelmInstallOnRealNode installs gpulink the way a user does: the image
// `make image` builds, imported into the real node's containerd, and
// `helm install` of deployments/helm/gpulink. The kubelet plugin runs as the
// chart's DaemonSet pod on the real node (topology-file discovery: no GPU
// here; a stand-in driver root with driver files and /dev/nvidia* nodes),
// the controller as the chart's Deployment with two replicas, with the
// chart's RBAC and admission policies. The API-only node v100-node has no
// kubelet to run a DaemonSet pod: the chart's node affinity leaves it out
// and its plugin runs as a process, as in TestE2E. The API server audits
// ResourceSlice writes, so the test sees which identity wrote the real
// node's slices.
func TestHelmInstallOnRealNode(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cc := startChartCluster(ctx, t, "glhelm", "cluster and audit logs in c/logs, chart pods' logs in c/pod-logs",
		localcluster.Options{AuditPolicy: sliceAuditPolicy}, map[string]string{
			"helm":                  "build helm first (make helm)",
			"gpulink-kubeletplugin": "run `make build` first (the API-only node's plugin runs as a process)",
		})
	t.Logf("built %s and started the cluster in %.1fs", cc.imageRef, time.Since(begin).Seconds())
	root, binDir, dir, logDir, cluster := cc.root, cc.binDir, cc.dir, cc.logDir, cc.cluster
	helm, pluginBin := filepath.Join(binDir, "helm"), filepath.Join(binDir, "gpulink-kubeletplugin")
	if err := cluster.AddAPINode(ctx, v100Node); err != nil {
		t.Fatal(err)
	}
	client := cluster.Client()
	node := cluster.NodeName()
	s := &suite{cluster: cluster, client: client, realNode: node, mpsRoot: filepath.Join(dir, "mps")}

	testdata := filepath.Join(root, "driver", "topology", "testdata")
	driverRoot, driverFiles := s.prepareChartNode(ctx, t, filepath.Join(testdata, "pcie-nvbridge-8.txt"), dir)
	kubeletRoot := cluster.KubeletRootDir()
	pluginDir := filepath.Join(kubeletRoot, "plugins", driver.Name)
	// The plugin DaemonSet keeps off nodes without a kubelet by a node
	// affinity (a DaemonSet pod bound there would stay Pending); the
	// controller runs on the real node, the only one that runs pods.
	webhookPort := localcluster.FreePort(t)
	values := s.chartValues(t, dir, driverRoot, fmt.Sprintf(`kubeletPlugin:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions: [{key: %s, operator: DoesNotExist}]
controller:
  replicas: 2
  nodeSelector: {kubernetes.io/hostname: %s}
# This API server reaches no Service: the webhook by URL, on the node's
# network where both replicas serve the port (SO_REUSEPORT).
compat:
  port: %d
  url: https://127.0.0.1:%d/translate-pods
  tls: {ipSANs: [127.0.0.1]}
`, localcluster.APINodeLabel, node, webhookPort, webhookPort))
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
	runHelm(t, append([]string{"install", helmRelease, chart}, values...)...)
	t.Logf("helm install done %.1fs after the start", time.Since(begin).Seconds())
	t.Logf("%s is an API-only node (no kubelet): its kubelet plugin runs as a process, the DaemonSet's node affinity (%s DoesNotExist) leaves it out", v100Node, localcluster.APINodeLabel)
	apiPlugin := filepath.Join(dir, "n", v100Node)
	for _, d := range []string{"registry", "plugin"} {
		// The kubelet creates these on a real node; nothing does on an API-only one.
		if err := os.MkdirAll(filepath.Join(apiPlugin, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	p := localcluster.StartBinary(t, logDir, "kubeletplugin-"+v100Node, pluginBin,
		"--node-name="+v100Node,
		"--kubeconfig="+cluster.Kubeconfig(),
		"--discovery=topology-file",
		"--topology-file="+filepath.Join(testdata, "v100-sxm2-8-aliyun-sccgn6.txt"),
		"--gpu-product=Tesla V100-SXM2-16GB",
		"--gpu-memory=16Gi",
		"--gpu-compute-capability=7.0",
		"--kubelet-registrar-dir="+filepath.Join(apiPlugin, "registry"),
		"--kubelet-plugin-dir="+filepath.Join(apiPlugin, "plugin"),
		"--cdi-root="+filepath.Join(apiPlugin, "cdi"),
		"--mps-root="+filepath.Join(apiPlugin, "mps"),
		"--metrics-address=",
		"--v=2",
	)
	s.plugins = append(s.plugins, p)

	var plugin, leader, standby *corev1.Pod
	var webhookCert []byte
	ok := t.Run("the DaemonSet runs the plugin on the real node only, API-only nodes keep plugin processes", func(t *testing.T) {
		plugin = waitComponentPod(ctx, t, client, "kubelet-plugin", "")
		if plugin.Spec.NodeName != node {
			t.Errorf("plugin pod %s runs on %s, want %s", plugin.Name, plugin.Spec.NodeName, node)
		}
		checkDaemonSetNodes(ctx, t, client, 1)
		waitSlices(ctx, t, client, node, 8)
		if err := gpuview.WaitDevices(ctx, client, v100Node, 8, p.Alive); err != nil {
			t.Fatal(err)
		}
		if err := waitGatePolicy(ctx, client, ns); err != nil {
			t.Fatal(err)
		}
	}) && t.Run("the plugin writes its node's slices with its own pod-bound identity", func(t *testing.T) {
		// First, before the dry runs below add audit events of their own.
		checkSliceWriters(t, cluster, node, plugin)
		checkSliceIdentity(ctx, t, client, cluster, plugin)
	}) && t.Run("one controller replica leads, the other waits on the lease", func(t *testing.T) {
		leader, standby = checkLeaderElection(ctx, t, client, cluster)
	}) && t.Run("the controller's Go memory limit follows its container's", func(t *testing.T) {
		checkMemoryLimit(t, cluster, 1536<<20, leader, standby)
	}) && t.Run("the chart's webhook translates device-plugin pods", func(t *testing.T) {
		webhookCert = checkChartWebhook(ctx, t, client, nil)
	})
	if !ok {
		return
	}
	var first, share holding
	ok = t.Run("pods with claims run on the real node through the chart's plugin and controller", func(t *testing.T) {
		first = s.twoGPUPod(ctx, t, "two-gpus")
		checkDriverFiles(t, first, driverFiles)
		share = s.sharePod(ctx, t, first)
		checkDriverFiles(t, share, driverFiles)
	}) && t.Run("the chart's controller allocates an API-only node's GPUs", func(t *testing.T) {
		s.nvlinkQuad(ctx, t)
	}) && t.Run("only the leader decides", func(t *testing.T) {
		checkDecisions(ctx, t, client, cluster, leader, standby, "two-gpus", "share", "four-nvlink")
	})
	if !ok {
		return
	}
	ok = t.Run("helm upgrade rolls the plugin and keeps the prepared claims", func(t *testing.T) {
		runHelm(t, append([]string{"upgrade", helmRelease, chart, "--set-string", "kubeletPlugin.podAnnotations.rollout=2"}, values...)...)
		checkChartWebhook(ctx, t, client, webhookCert)
		rolled := waitComponentPod(ctx, t, client, "kubelet-plugin", plugin.UID)
		t.Logf("plugin pod %s replaced by %s", plugin.Name, rolled.Name)
		waitSlices(ctx, t, client, node, 8)
		cp, err := kubeletplugin.NewCheckpointStore(pluginDir).Load()
		if err != nil {
			t.Fatalf("checkpoint after the upgrade: %v", err)
		}
		for _, h := range []holding{first, share} {
			if pc := cp.Claims[h.claim.UID]; pc == nil || pc.State != kubeletplugin.PrepareCompleted {
				t.Errorf("checkpoint after the upgrade lacks prepared claim %s: %+v", h.claim.Name, cp.Claims)
			}
			if _, err := os.Stat(claimSpec(cluster, h)); err != nil {
				t.Errorf("CDI spec of running pod %s's claim gone after the upgrade: %v", h.pod.Name, err)
			}
		}
	}) && t.Run("another replica takes over when the leader's pod goes", func(t *testing.T) {
		// The leader releases the Lease as it stops; the standby and the
		// Deployment's replacement pod race for it.
		if err := client.CoreV1().Pods(chartNamespace).Delete(ctx, leader.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		leader, standby = waitNewLeader(ctx, t, client, cluster, leader)
	}) && t.Run("the new plugin unprepares the old one's claims and prepares new ones", func(t *testing.T) {
		// Deleting every pod: the new plugin pod removes the CDI specs of
		// what the old one prepared; then a pod with all 8 GPUs, allocated
		// by the new leader and prepared by the new plugin pod.
		s.cleanupFreesDevices(ctx, t)
		cp, err := kubeletplugin.NewCheckpointStore(pluginDir).Load()
		if err != nil {
			t.Fatal(err)
		}
		if len(cp.Claims) != 0 {
			t.Errorf("checkpoint keeps claims after their pods were deleted: %+v", cp.Claims)
		}
		checkDecisions(ctx, t, client, cluster, leader, standby, "all-eight")
	})
	if !ok {
		return
	}
	t.Run("helm uninstall leaves no slices of the real node", func(t *testing.T) {
		runHelm(t, "uninstall", helmRelease, "--wait", "--timeout", "2m")
		// The kubelet deletes the slices of a driver whose plugin
		// unregistered and did not come back within 30 s (kubeletplugin
		// doc.go, "Shutdown").
		start := time.Now()
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			return nodeDevices(ctx, client, node) == 0, nil
		})
		if err != nil {
			t.Fatalf("ResourceSlices of %s on %s left after helm uninstall: %v", driver.Name, node, err)
		}
		t.Logf("the real node's slices were gone %.1fs after helm uninstall returned", time.Since(start).Seconds())
		// The API-only node's plugin is a process, not the chart's.
		if n := nodeDevices(ctx, client, v100Node); n != 8 {
			t.Errorf("API-only node %s publishes %d devices after the uninstall, want its process's 8", v100Node, n)
		}
	})
	t.Logf("helm install e2e took %.1fs", time.Since(begin).Seconds())
}

// sliceAuditPolicy audits every ResourceSlice write with its request body:
// the slice's node and the identity that wrote it.
const sliceAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [create, update, patch]
    resources: [{group: resource.k8s.io, resources: [resourceslices]}]
  - level: None
`

// auditEvent is the part of an audit.k8s.io/v1 Event the test reads.
type auditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	ObjectRef *struct {
		Resource string `json:"resource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestObject json.RawMessage `json:"requestObject"`
}

// checkSliceWriters reads the API server's audit log: every successful
// write of a gpulink slice for node came from the chart's plugin service
// account with a token bound to the plugin pod on that node (the identity
// the slice admission policy checks), and at least one did.
func checkSliceWriters(t *testing.T, cluster *localcluster.Cluster, node string, plugin *corev1.Pod) {
	t.Helper()
	data, err := os.ReadFile(cluster.AuditLogPath())
	if err != nil {
		t.Fatal(err)
	}
	wantUser := "system:serviceaccount:" + chartNamespace + ":" + plugin.Spec.ServiceAccountName
	writes := 0
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("audit log line %q: %v", line, err)
		}
		if ev.Stage != "ResponseComplete" || ev.ObjectRef == nil || ev.ObjectRef.Resource != "resourceslices" ||
			ev.ResponseStatus == nil || ev.ResponseStatus.Code >= 300 || strings.Contains(ev.RequestURI, "dryRun") {
			continue
		}
		var sl resourceapi.ResourceSlice
		if err := json.Unmarshal(ev.RequestObject, &sl); err != nil || sl.Spec.Driver != driver.Name || ptr.Deref(sl.Spec.NodeName, "") != node {
			continue
		}
		writes++
		pod, onNode := ev.User.Extra["authentication.kubernetes.io/pod-name"], ev.User.Extra["authentication.kubernetes.io/node-name"]
		if ev.User.Username != wantUser || len(pod) != 1 || pod[0] != plugin.Name || len(onNode) != 1 || onNode[0] != node {
			t.Errorf("%s of a slice of node %s by user %q (pod %v, node %v), want %s with a token bound to pod %s on %s",
				ev.Verb, node, ev.User.Username, pod, onNode, wantUser, plugin.Name, node)
		}
	}
	if writes == 0 {
		t.Fatalf("no successful write of a %s slice of node %s in the audit log %s", driver.Name, node, cluster.AuditLogPath())
	}
	t.Logf("%d writes of node %s's slices, all by %s bound to pod %s", writes, node, wantUser, plugin.Name)
}

// checkDaemonSetNodes checks that the plugin DaemonSet wants pods on
// exactly nodes nodes: the real node, not the API-only ones.
func checkDaemonSetNodes(ctx context.Context, t *testing.T, client kubernetes.Interface, nodes int32) {
	t.Helper()
	var ds *appsv1.DaemonSet
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		ds, err = client.AppsV1().DaemonSets(chartNamespace).Get(ctx, helmRelease+"-kubelet-plugin", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return ds.Status.ObservedGeneration == ds.Generation && ds.Status.DesiredNumberScheduled > 0, nil
	})
	if err != nil {
		t.Fatalf("the DaemonSet controller did not schedule the plugin DaemonSet: %v", err)
	}
	if ds.Status.DesiredNumberScheduled != nodes {
		pods, _ := client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
		var on []string
		for _, p := range pods.Items {
			on = append(on, p.Name+" for node "+daemonPodNode(&p))
		}
		t.Errorf("the plugin DaemonSet wants %d pods, want %d (nodes with a kubelet only): %v", ds.Status.DesiredNumberScheduled, nodes, on)
	}
}

// daemonPodNode is the node a DaemonSet pod is for: its spec.nodeName once
// bound, before that the node the DaemonSet controller pinned it to (a
// node affinity on metadata.name).
func daemonPodNode(p *corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, f := range term.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	return "?"
}

// checkDriverFiles checks that the pod's container sees the driver files
// of the base CDI spec the DaemonSet's plugin generated with nvcdi (the
// libcuda.so link from its create-symlinks hook, which the container
// runtime ran with the nvidia-cdi-hook the plugin copied from its image to
// the host).
func checkDriverFiles(t *testing.T, h holding, files []string) {
	t.Helper()
	for _, f := range files {
		if !strings.Contains(h.log, "\nFILE "+f+"\n") {
			t.Errorf("pod %s does not see driver file %s:\n%s", h.pod.Name, f, h.log)
		}
	}
}

// claimSpec is the path of the CDI spec of h's claim.
func claimSpec(cluster *localcluster.Cluster, h holding) string {
	return filepath.Join(cluster.CDIDir(), driver.Name+"-claim_"+string(h.claim.UID)+".json")
}

// nodeDevices counts the devices node's gpulink slices publish.
func nodeDevices(ctx context.Context, client kubernetes.Interface, node string) int {
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node,
	})
	if err != nil {
		return -1
	}
	n := 0
	for _, sl := range slices.Items {
		if sl.Spec.Driver == driver.Name {
			n += len(sl.Spec.Devices)
		}
	}
	return n
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
// replicas, which logs that it leads, and that the other logs that it
// waits; it returns the leader and the standby.
func checkLeaderElection(ctx context.Context, t *testing.T, client kubernetes.Interface, cluster *localcluster.Cluster) (leader, standby *corev1.Pod) {
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
		holder, err = leaseHolder(ctx, client)
		return len(pods) == 2 && holder != "", err
	})
	if err != nil {
		t.Fatalf("want 2 running controller replicas and a lease holder; have %d, holder %q: %v", len(pods), holder, err)
	}
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
		switch {
		case leads && leader != nil:
			t.Errorf("lease holder %q matches controller pods %s and %s", holder, leader.Name, p.Name)
		case leads:
			leader = p
		case strings.Contains(log, "Became leader"):
			t.Errorf("controller pod %s is not the lease holder (%s) but logged that it leads", p.Name, holder)
		default:
			standby = p
		}
	}
	if leader == nil || standby == nil {
		t.Fatalf("lease holder %q: want one leading and one standby replica among %d pods", holder, len(pods))
	}
	t.Logf("controller pod %s leads, %s waits on the lease", leader.Name, standby.Name)
	return leader, standby
}

// leaseHolder returns the holder identity of the controller's Lease
// ("<pod>_<uuid>"), empty while there is none.
func leaseHolder(ctx context.Context, client kubernetes.Interface) (string, error) {
	lease, err := client.CoordinationV1().Leases(chartNamespace).Get(ctx, helmRelease+"-controller", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return ptr.Deref(lease.Spec.HolderIdentity, ""), nil
}

// waitNewLeader waits until a running controller pod other than old holds
// the controller's Lease and logs that it leads, while another one (the
// former standby or the Deployment's replacement of old, whichever did not
// win the lease) waits; it returns both.
func waitNewLeader(ctx context.Context, t *testing.T, client kubernetes.Interface, cluster *localcluster.Cluster, old *corev1.Pod) (leader, standby *corev1.Pod) {
	t.Helper()
	var holder, log string
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if holder, err = leaseHolder(ctx, client); err != nil {
			return false, err
		}
		list, err := client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=controller"})
		if err != nil {
			return false, err
		}
		leader, standby = nil, nil
		for i := range list.Items {
			p := &list.Items[i]
			if p.UID == old.UID || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			if strings.HasPrefix(holder, p.Name+"_") {
				leader = p
			} else {
				standby = p
			}
		}
		if leader == nil || standby == nil {
			return false, nil
		}
		log, _ = localcluster.ReadPodLogFile(cluster.PodLogDir(), leader, "controller")
		return strings.Contains(log, "Became leader"), nil
	})
	if err != nil {
		t.Fatalf("no running controller pod other than %s took the lease with another one waiting (holder %q): %v\n%s", old.Name, holder, err, log)
	}
	t.Logf("controller pod %s took over the lease %.1fs after leader %s was deleted; %s waits", leader.Name, time.Since(start).Seconds(), old.Name, standby.Name)
	return leader, standby
}

// checkDecisions checks that the leader's log has an allocation decision
// for each of pods (in namespace ns) and that the standby's, when given,
// has none at all.
func checkDecisions(ctx context.Context, t *testing.T, client kubernetes.Interface, cluster *localcluster.Cluster, leader, standby *corev1.Pod, pods ...string) {
	t.Helper()
	if holder, err := leaseHolder(ctx, client); err != nil || !strings.HasPrefix(holder, leader.Name+"_") {
		t.Fatalf("lease holder %q (err %v), want controller pod %s", holder, err, leader.Name)
	}
	log, err := localcluster.ReadPodLogFile(cluster.PodLogDir(), leader, "controller")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range pods {
		found := false
		for _, l := range strings.Split(log, "\n") {
			found = found || strings.Contains(l, `"Allocated"`) && strings.Contains(l, `pod="`+ns+"/"+name+`"`)
		}
		if !found {
			t.Errorf("leader %s logged no allocation of pod %s/%s:\n%s", leader.Name, ns, name, log)
		}
	}
	if standby == nil {
		return
	}
	log, err = localcluster.ReadPodLogFile(cluster.PodLogDir(), standby, "controller")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(log, `"Allocated"`); n > 0 {
		t.Errorf("standby controller pod %s logged %d allocations:\n%s", standby.Name, n, log)
	}
}

// checkChartWebhook waits until a dry-run pod asking for nvidia.com/gpu is
// translated by the chart's webhook, and returns the webhook's serving
// certificate; with want set, the certificate must still be want (helm
// upgrade keeps the generated CA and certificate).
func checkChartWebhook(ctx context.Context, t *testing.T, client kubernetes.Interface, want []byte) []byte {
	t.Helper()
	secret, err := client.CoreV1().Secrets(chartNamespace).Get(ctx, helmRelease+"-controller-webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cert := secret.Data["tls.crt"]
	if want != nil && !bytes.Equal(cert, want) {
		t.Error("helm upgrade replaced the webhook's certificate")
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "translated"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "c", Image: localcluster.WorkloadImage,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
	}}}}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err
			return false, nil
		}
		return len(got.Spec.ResourceClaims) == 1 && gated(got) == 1, nil
	})
	if err != nil {
		t.Fatalf("the chart's webhook never translated a pod: %v (last error: %v)", err, last)
	}
	return cert
}

// The real node's GPUs in the chart tests (pcie-nvbridge-8.txt).
const chartGPUProduct, chartGPUMemory, chartComputeCapability = "NVIDIA A40", "48Gi", "8.6"

// chartValues writes the chart values every chart test shares, and the
// test's own (own, which helm merges over them), into dir and returns the
// helm arguments that pass both. The local cluster has no pod network and
// no kube-proxy: the pods use the host network and reach the API server
// on 127.0.0.1 (apiServer sets KUBERNETES_SERVICE_HOST/PORT in their
// containers); the plugin reads the node's GPUs from the topology file
// prepareChartNode put in a ConfigMap, and the kubelet root, the CDI and
// MPS directories live under the test directory.
func (s *suite) chartValues(t *testing.T, dir, driverRoot, own string) []string {
	t.Helper()
	apiURL, err := url.Parse(s.cluster.RESTConfig().Host)
	if err != nil {
		t.Fatal(err)
	}
	shared := fmt.Sprintf(`image:
  repository: %s
  tag: e2e
  pullPolicy: Never
apiServer:
  host: %q
  port: %s
kubeletPlugin:
  discovery: topology-file
  topologyConfigMap: gpulink-topology
  gpuProduct: %s
  gpuMemory: %s
  driverRoot: %s
  kubeletRootDir: %s
  cdiRoot: %s
  mpsRoot: %s
  hostNetwork: true
  metricsPort: %d
  extraArgs: ["--gpu-compute-capability=%s", "--v=2"]
controller:
  hostNetwork: true
  metricsPort: 0
  healthPort: 0
`, localcluster.ProductImageRepo, apiURL.Hostname(), apiURL.Port(), chartGPUProduct, chartGPUMemory, driverRoot,
		s.cluster.KubeletRootDir(), s.cluster.CDIDir(), s.mpsRoot, localcluster.FreePort(t), chartComputeCapability)
	var args []string
	for _, f := range []struct{ name, body string }{{"values-shared.yaml", shared}, {"values.yaml", own}} {
		path := filepath.Join(dir, f.name)
		if err := os.WriteFile(path, []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", path)
	}
	return args
}

// prepareChartNode readies the real node and the cluster for a helm install
// of the chart: the namespace, the topology ConfigMap gpulink-topology the
// values name (from the topology file), a stand-in driver install under
// dir/driver and /dev stand-ins for 8 GPUs there; the workloads see the
// driver files (s.workloadEnv). It returns the driver root and its files.
func (s *suite) prepareChartNode(ctx context.Context, t *testing.T, topologyFile, dir string) (driverRoot string, driverFiles []string) {
	t.Helper()
	topology, err := os.ReadFile(topologyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chartNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.CoreV1().ConfigMaps(chartNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "gpulink-topology"},
		Data:       map[string]string{"topology.txt": string(topology)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A stand-in driver install: the chart's plugin puts its files into
	// the base CDI spec with nvcdi, and the containers must see them.
	driverRoot = filepath.Join(dir, "driver")
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
	driverFiles = append(localcluster.WriteFakeDriver(t, driverRoot), "/usr/lib/x86_64-linux-gnu/libcuda.so")
	// /dev/nvidia* stand-ins: the chart's plugin puts the claimed GPUs'
	// nodes into the claims' CDI specs, as the plugin process does in TestE2E.
	s.devNodes = localcluster.MkDeviceNodes(t, driverRoot, 8)
	s.workloadEnv = []corev1.EnvVar{{Name: "GPULINK_WORKLOAD_FILES", Value: strings.Join(driverFiles, ",")}}
	return driverRoot, driverFiles
}

// chartCluster is what the chart e2e tests start from: a real-node
// cluster with the product image imported, the repository and binary
// directories, and the test's directory.
type chartCluster struct {
	root, binDir, dir, logDir string
	imageRef                  string
	cluster                   *localcluster.Cluster
}

// startChartCluster skips without root, fails naming how to build each
// binary of need (its name in the binary directory, and the hint) that is
// missing, builds the product image, starts a real-node cluster under the
// test directory (prefix, hint: testDir) with opts, stopped at cleanup,
// and imports the image into its node.
func startChartCluster(ctx context.Context, t *testing.T, prefix, hint string, opts localcluster.Options, need map[string]string) chartCluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	var cc chartCluster
	var err error
	if cc.root, err = localcluster.RepoRoot(); err != nil {
		t.Fatal(err)
	}
	if cc.binDir, err = localcluster.DefaultBinDir(); err != nil {
		t.Fatal(err)
	}
	for bin, how := range need {
		if _, err := os.Stat(filepath.Join(cc.binDir, bin)); err != nil {
			t.Fatalf("%v: %s", err, how)
		}
	}
	var imageTar string
	if cc.imageRef, imageTar, err = localcluster.BuildProductImage(ctx, "e2e"); err != nil {
		t.Fatal(err)
	}
	cc.dir, cc.logDir = testDir(t, prefix, hint)
	opts.Dir, opts.RealNode, opts.Logf = filepath.Join(cc.dir, "c"), true, t.Logf
	if cc.cluster, err = localcluster.Start(ctx, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cc.cluster.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	if err := cc.cluster.ImportImage(ctx, imageTar); err != nil {
		t.Fatal(err)
	}
	return cc
}
