//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/localcluster"
)

// kueueNodes are the API-only GPU nodes of the Kueue tests: 4 GPUs each,
// two NVLink-bridged pairs (workstation-4-nvbridge.txt), under three leaf
// switches of one spine. Leaf l1 holds exactly one gang of 4 pods × 2
// GPUs, l2 holds 12 GPUs, l3 4: no leaf holds 4 pods × 4 GPUs.
var kueueNodes = []struct{ name, leaf string }{
	{"kq-a1", "l1"}, {"kq-a2", "l1"},
	{"kq-b1", "l2"}, {"kq-b2", "l2"}, {"kq-b3", "l2"},
	{"kq-c1", "l3"},
}

const kueueTopologyFixture = "workstation-4-nvbridge.txt"

// kueueSuite is a local cluster (no real node) with gpulink's controller
// process (its chart's DeviceClasses, scheduling-gate policy and
// translation webhook) and Kueue's manager process.
type kueueSuite struct {
	cluster *localcluster.Cluster
	client  kubernetes.Interface
	dyn     dynamic.Interface
	topo    *topology.Topology
}

// setupKueue starts the cluster, gpulink and Kueue. The Kueue manager is
// configured with waitForPodsReady's timeout podsReadyTimeout.
func setupKueue(ctx context.Context, t *testing.T, podsReadyTimeout time.Duration) *kueueSuite {
	t.Helper()
	kueueBinary(t) // skips early where Kueue is not built
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	controllerBin := filepath.Join(binDir, "gpulink-controller")
	if _, err := os.Stat(controllerBin); err != nil {
		t.Fatalf("%v: run `make build` first", err)
	}
	topo, err := topology.ParseFile(filepath.Join(root, "driver", "topology", "testdata", kueueTopologyFixture))
	if err != nil {
		t.Fatal(err)
	}
	chart, err := renderChart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	webhookPort := localcluster.FreePort(t)
	compatChart := renderCompat(ctx, t, webhookPort)

	dir, logDir := testDir(t, "glkq", "component logs in c/logs, gpulink and Kueue logs in logs")
	cluster := localcluster.StartForTest(ctx, t, dir, localcluster.Options{})
	s := &kueueSuite{cluster: cluster, client: cluster.Client(), topo: topo}
	if s.dyn, err = dynamic.NewForConfig(cluster.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	if err := chart.InstallClusterScoped(ctx, s.client); err != nil {
		t.Fatal(err)
	}
	if err := waitGatePolicy(ctx, s.client, ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range kueueNodes {
		s.addNode(ctx, t, n.name, n.leaf)
	}

	healthPort := localcluster.FreePort(t)
	controller := localcluster.StartBinary(t, logDir, "controller", controllerBin, append([]string{
		"--kubeconfig=" + cluster.Kubeconfig(),
		"--leader-elect=false",
		fmt.Sprintf("--health-address=127.0.0.1:%d", healthPort),
		"--metrics-address=",
		"--v=2",
	}, compatControllerArgs(t, compatChart, webhookPort)...)...)
	if err := controller.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &compatChart.webhook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhook(ctx, t, &suite{client: s.client})

	startKueue(ctx, t, kueueOptions{cluster: cluster, dir: dir, logDir: logDir,
		podsReadyTimeout: podsReadyTimeout, requeueBaseSeconds: 60})
	return s
}

// addNode adds an API-only node in the leaf (and spine s1) with the
// ResourceSlice gpulink's kubelet plugin would publish for it.
func (s *kueueSuite) addNode(ctx context.Context, t *testing.T, name, leaf string) {
	t.Helper()
	if err := s.cluster.AddAPINode(ctx, name); err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q,%q:"s1"}}}`, gang.LabelLeaf, leaf, gang.LabelSpine)
	if _, err := s.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	slice, err := controllertest.Slice(name, s.topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// namespace creates a namespace and waits for its default service account.
func (s *kueueSuite) namespace(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := s.client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no default service account in %s: %v", name, err)
	}
}

// template creates a ResourceClaimTemplate of count whole GPUs of
// gpulink's DeviceClass: the form Kueue's DRA support counts (one
// ExactCount request, no selectors, constraints or config).
func (s *kueueSuite) template(ctx context.Context, t *testing.T, namespace, name string, count int64) {
	t.Helper()
	tpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}},
		}}},
	}
	if _, err := s.client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// applyKueue creates Kueue objects from YAML (several documents).
func (s *kueueSuite) applyKueue(ctx context.Context, t *testing.T, manifest string) {
	t.Helper()
	objs, err := localcluster.DecodeObjects([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		var gvr = clusterQueueGVR
		switch o.GetKind() {
		case "ClusterQueue":
		case "LocalQueue":
			gvr = localQueueGVR
		case "ResourceFlavor":
			gvr = resourceFlavorGVR
		default:
			t.Fatalf("unexpected %s in Kueue manifest", o.GetKind())
		}
		var res dynamic.ResourceInterface = s.dyn.Resource(gvr)
		if o.GetNamespace() != "" {
			res = s.dyn.Resource(gvr).Namespace(o.GetNamespace())
		}
		if _, err := res.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// teamQueues is a ClusterQueue with quota nvidia.com/gpu (gpulink's
// whole GPUs through Kueue's DeviceClass mapping, and device-plugin-style
// requests) on the flavor "gpus", and a LocalQueue of the same name in the
// team's namespace.
func teamQueues(team string, gpus int) string {
	return fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: %[1]s
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: ["nvidia.com/gpu"]
    flavors:
    - name: gpus
      resources:
      - name: nvidia.com/gpu
        nominalQuota: %[2]d
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: %[1]s
  namespace: %[1]s
spec:
  clusterQueue: %[1]s
`, team, gpus)
}

// gpuFlavor is the one ResourceFlavor: no node labels, gpulink chooses the
// nodes.
const gpuFlavor = `apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: gpus
`

// clusterQueueGPUs returns how many nvidia.com/gpu the ClusterQueue has
// reserved for admitted workloads (status.flavorsReservation), and how many
// workloads reserve them.
func (s *kueueSuite) clusterQueueGPUs(ctx context.Context, name string) (reserved int64, workloads int64, err error) {
	cq, err := s.dyn.Resource(clusterQueueGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, 0, err
	}
	var status struct {
		ReservingWorkloads int64 `json:"reservingWorkloads"`
		FlavorsReservation []struct {
			Name      string `json:"name"`
			Resources []struct {
				Name  string `json:"name"`
				Total string `json:"total"`
			} `json:"resources"`
		} `json:"flavorsReservation"`
	}
	if err := fromUnstructured(cq, "status", &status); err != nil {
		return 0, 0, err
	}
	for _, f := range status.FlavorsReservation {
		for _, r := range f.Resources {
			if r.Name == "nvidia.com/gpu" {
				var n int64
				if _, err := fmt.Sscan(r.Total, &n); err != nil {
					return 0, 0, fmt.Errorf("ClusterQueue %s: flavorsReservation %s total %q: %w", name, f.Name, r.Total, err)
				}
				reserved += n
			}
		}
	}
	return reserved, status.ReservingWorkloads, nil
}

// fromUnstructured decodes the field of an unstructured object into out.
func fromUnstructured(u *unstructured.Unstructured, field string, out any) error {
	v, ok := u.Object[field]
	if !ok {
		return nil
	}
	raw, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	return yaml.Unmarshal(raw, out)
}

// checkClusterQueueGPUs waits until the ClusterQueue's status (which Kueue
// updates after its decisions, not with them) reports gpus nvidia.com/gpu
// reserved by workloads, and fails if it does not within a minute.
func (s *kueueSuite) checkClusterQueueGPUs(ctx context.Context, t *testing.T, name string, gpus, workloads int64, why string) {
	t.Helper()
	var got, wls int64
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, wls, last = s.clusterQueueGPUs(ctx, name)
		return last == nil && got == gpus && wls == workloads, nil
	})
	if err != nil {
		t.Errorf("ClusterQueue %s reserves %d nvidia.com/gpu for %d workloads (%v), want %d for %d%s", name, got, wls, last, gpus, workloads, why)
	}
}
