//go:build e2e

package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// TestE2EMPSConcurrent runs Concurrent MPS shares (DeviceClass
// gpu-share-concurrent.gpulink.dev, from the chart, where
// deviceClasses.concurrentShareClass is on by default) on the real node's
// simulated GPUs, through the controller and the real node's kubelet
// plugin:
//
//  1. two pods of namespace A, each with a claim of its own from a
//     template, are placed on one GPU, run, and share one MPS control
//     daemon, the group's (gpulink-mps-<A>-gpu-<UUID>): one daemon started,
//     one directory <mpsRoot>/<A>-gpu-<UUID> whose pipe both containers
//     get, each claim's own limits in its CDI spec and its container's
//     environment;
//  2. a pod of namespace B with the same class is placed on another GPU and
//     gets a daemon of its own group;
//  3. an Isolated share (gpu-share.gpulink.dev) of namespace A is placed on
//     neither group's GPU and gets its claim's own daemon;
//  4. deleting A's concurrent pods one by one stops A's group daemon only
//     with the last: it still runs after the first is gone (the other
//     pod keeps running), and is stopped after the second.
//
// With simulated GPUs the plugin runs no daemon process or pod
// (mps.DirOnlyDaemon: there is no nvidia-cuda-mps-control); a daemon is
// its directory, the plugin's "up"/"stopped" log lines and its
// gpulink_kubeletplugin_mps_daemons gauge, which is what this test reads.
// Where the plugin does run daemon pods, the group's must be exactly one,
// named and labelled as docs/mps.md says.
func TestE2EMPSConcurrent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	s := setup(ctx, t)
	t.Logf("gpulink deployed %.1fs after the start", time.Since(begin).Seconds())
	const nsA, nsB = "team-a", "team-b"
	for _, n := range []string{nsA, nsB} {
		s.gatedNamespace(ctx, t, n)
	}
	c := &concurrentCheck{suite: s}

	var a1, a2, b, iso holding
	var gpuA, gpuB gpuview.GPU
	ok := t.Run("two Concurrent shares of one namespace share a GPU and one daemon", func(t *testing.T) {
		s.templateIn(ctx, t, nsA, "conc-30", shareRequest(driver.DeviceClassShareConcurrent, "2Gi", 30), nil)
		s.templateIn(ctx, t, nsA, "conc-20", shareRequest(driver.DeviceClassShareConcurrent, "3Gi", 20), nil)
		a1 = c.sharePod(ctx, t, nsA, "conc-a1", "conc-30")
		gpuA = c.gpu(ctx, t, a1)
		a2 = c.sharePod(ctx, t, nsA, "conc-a2", "conc-20")
		if !slices.Equal(a2.Devices, a1.Devices) {
			t.Fatalf("second Concurrent share of %s on %s, the first on %s: want one GPU (one MPS server)", nsA, gpuview.Indexes(a2.Devices), gpuview.Indexes(a1.Devices))
		}
		id := c.groupDaemon(t, nsA, gpuA)
		c.checkLimits(t, a1, id, "2048", "30")
		c.checkLimits(t, a2, id, "3072", "20")
		c.wantDaemons(ctx, t, id)
		if n := c.started(t, id); n != 1 {
			t.Errorf("the plugin started the daemon %s %d times for two claims, want once", id, n)
		}
		c.checkDaemonPods(ctx, t, nsA, gpuA)
	}) && t.Run("a Concurrent share of another namespace gets another GPU and its own daemon", func(t *testing.T) {
		s.templateIn(ctx, t, nsB, "conc-30", shareRequest(driver.DeviceClassShareConcurrent, "2Gi", 30), nil)
		b = c.sharePod(ctx, t, nsB, "conc-b1", "conc-30")
		gpuB = c.gpu(ctx, t, b)
		if gpuB.Device == gpuA.Device {
			t.Fatalf("%s's Concurrent share joined %s's GPU %s", nsB, nsA, gpuA.Device)
		}
		idB := c.groupDaemon(t, nsB, gpuB)
		c.checkLimits(t, b, idB, "2048", "30")
		c.wantDaemons(ctx, t, c.groupDaemon(t, nsA, gpuA), idB)
		c.checkDaemonPods(ctx, t, nsB, gpuB)
	}) && t.Run("an Isolated share of the namespace keeps off the Concurrent GPUs", func(t *testing.T) {
		s.templateIn(ctx, t, nsA, "isolated", shareRequest(driver.DeviceClassShare, "2Gi", 30), nil)
		iso = c.sharePod(ctx, t, nsA, "iso-a", "isolated")
		if d := iso.Devices[0]; d == gpuA.Device || d == gpuB.Device {
			t.Fatalf("Isolated share of %s on %s, which holds Concurrent shares (%s: %s, %s: %s)", nsA, d, nsA, gpuA.Device, nsB, gpuB.Device)
		}
		// An Isolated share's daemon is its claim's own.
		c.checkLimits(t, iso, string(iso.claim.UID), "2048", "30")
		c.wantDaemons(ctx, t, c.groupDaemon(t, nsA, gpuA), c.groupDaemon(t, nsB, gpuB), string(iso.claim.UID))
	})
	if ok {
		t.Run("the group's daemon stops with its last claim", func(t *testing.T) {
			idA, idB := c.groupDaemon(t, nsA, gpuA), c.groupDaemon(t, nsB, gpuB)
			c.deleteAndWait(ctx, t, a1)
			// a2 still holds the daemon and keeps running.
			c.wantDaemons(ctx, t, idA, idB, string(iso.claim.UID))
			if n := c.stopped(t, idA); n != 0 {
				t.Errorf("daemon %s stopped %d times after its first claim went, want it running for %s", idA, n, a2.claim.Name)
			}
			if p, err := s.client.CoreV1().Pods(nsA).Get(ctx, a2.pod.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
				t.Errorf("pod %s/%s after %s went: %v", nsA, a2.pod.Name, a1.pod.Name, describePod(ctx, s.client, nsA, a2.pod.Name))
			}
			t.Logf("pod %s/%s gone; daemon %s still up for %s", nsA, a1.pod.Name, idA, a2.pod.Name)
			c.deleteAndWait(ctx, t, a2)
			c.wantDaemons(ctx, t, idB, string(iso.claim.UID))
			if n := c.stopped(t, idA); n != 1 {
				t.Errorf("daemon %s stopped %d times after its last claim went, want once", idA, n)
			}
			c.checkDaemonPods(ctx, t, nsA, gpuview.GPU{})
			t.Logf("pod %s/%s gone; daemon %s stopped", nsA, a2.pod.Name, idA)
		})
	}
	t.Logf("Concurrent MPS e2e took %.1fs", time.Since(begin).Seconds())
}

// concurrentCheck reads what the real node's kubelet plugin made of MPS
// claims: their daemons, CDI specs and limits.
type concurrentCheck struct {
	*suite
}

// shareRequest is a request for one share of class with memory and cores.
func shareRequest(class, memory string, cores int64) resourceapi.ExactDeviceRequest {
	return resourceapi.ExactDeviceRequest{
		DeviceClassName: class,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			driver.CapacityMemory: resource.MustParse(memory),
			driver.CapacityCores:  *resource.NewQuantity(cores, resource.DecimalSI),
		}},
	}
}

// gatedNamespace creates a namespace the scheduling-gate policy applies
// to, with its default service account.
func (s *suite) gatedNamespace(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	_, err := s.client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating the default service account of %s: %v", name, err)
	}
}

// sharePod runs a pod of namespace with a claim from template on the
// real node and waits until its claim holds one share there and it runs.
func (c *concurrentCheck) sharePod(ctx context.Context, t *testing.T, namespace, name, template string) holding {
	t.Helper()
	if pod := c.createPod(ctx, t, namespace, name, template, c.realNode); gated(pod) != 1 {
		t.Fatalf("pod %s/%s was created with gates %v; want the admission policy to add %s once", namespace, name, pod.Spec.SchedulingGates, driver.SchedulingGate)
	}
	h := c.waitBoundIn(ctx, t, namespace, name)
	if h.Node != c.realNode || len(h.Devices) != 1 || len(h.Shares) != 1 {
		t.Fatalf("claim %s/%s holds %v (shares %d) on %s, want one share on %s", namespace, h.claim.Name, h.Devices, len(h.Shares), h.Node, c.realNode)
	}
	c.waitRunning(ctx, t, &h)
	c.checkDevices(t, c.nodes(ctx, t)[c.realNode], h)
	return h
}

// gpu is the published GPU of h's share.
func (c *concurrentCheck) gpu(ctx context.Context, t *testing.T, h holding) gpuview.GPU {
	t.Helper()
	g, ok := c.nodes(ctx, t)[c.realNode].GPU(h.Devices[0])
	if !ok || g.UUID == "" {
		t.Fatalf("%s publishes no %s with a UUID (%+v)", c.realNode, h.Devices[0], g)
	}
	return g
}

// daemonPodName is the name docs/mps.md gives the daemon pod of namespace's
// Concurrent shares on gpu: gpulink-mps-<namespace>-gpu-<UUID without
// GPU->, in lower case>.
func daemonPodName(namespace string, gpu gpuview.GPU) string {
	return "gpulink-mps-" + namespace + "-gpu-" + strings.ToLower(strings.TrimPrefix(gpu.UUID, "GPU-"))
}

// groupDaemon is the ID (directory name, daemon pod name without
// gpulink-mps-) of namespace's daemon on gpu, and checks that the plugin's
// naming (mps.GroupID) is the documented one.
func (c *concurrentCheck) groupDaemon(t *testing.T, namespace string, gpu gpuview.GPU) string {
	t.Helper()
	id := mps.GroupID(namespace, mps.GPU{Index: gpu.Index, UUID: gpu.UUID})
	if want := strings.TrimPrefix(daemonPodName(namespace, gpu), "gpulink-mps-"); id != want {
		t.Fatalf("group daemon of %s on %s (%s) is %s, docs/mps.md names it %s", namespace, gpu.Device, gpu.UUID, id, want)
	}
	return id
}

// daemonDirs lists the MPS daemons' directories under the real node's
// MPS root.
func (c *concurrentCheck) daemonDirs() ([]string, error) {
	entries, err := os.ReadDir(c.mpsRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// wantDaemons waits until the real node runs exactly the daemons ids:
// their directories (pipe, log, shm) and no others under the MPS root, and
// the plugin's gpulink_kubeletplugin_mps_daemons says as many.
func (c *concurrentCheck) wantDaemons(ctx context.Context, t *testing.T, ids ...string) {
	t.Helper()
	want := slices.Sorted(slices.Values(ids))
	var state string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.alive(); err != nil {
			return false, err
		}
		dirs, err := c.daemonDirs()
		if err != nil {
			return false, err
		}
		if !slices.Equal(dirs, want) {
			state = fmt.Sprintf("MPS directories %v", dirs)
			return false, nil
		}
		for _, id := range want {
			for _, sub := range []string{"pipe", "log", "shm"} {
				if fi, err := os.Stat(filepath.Join(c.mpsRoot, id, sub)); err != nil || !fi.IsDir() {
					state = fmt.Sprintf("daemon %s: no %s directory (%v)", id, sub, err)
					return false, nil
				}
			}
		}
		m, err := scrapeMetrics(ctx, c.pluginMetrics)
		if err != nil {
			state = err.Error()
			return false, nil
		}
		n, ok := m.value("gpulink_kubeletplugin_mps_daemons")
		if !ok || n != float64(len(want)) {
			state = fmt.Sprintf("gpulink_kubeletplugin_mps_daemons %v (found %t)", n, ok)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("want MPS daemons %v on %s: %s: %v", want, c.realNode, state, err)
	}
}

// pluginLogLines counts the real node's plugin log lines that contain msg
// and daemon (as the plugin's structured log quotes them).
func (c *concurrentCheck) pluginLogLines(t *testing.T, msg, daemon string) int {
	t.Helper()
	b, err := os.ReadFile(c.plugins[0].Log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"`+msg+`"`) && strings.Contains(l, `daemon="`+daemon+`"`) {
			n++
		}
	}
	return n
}

// started counts the starts of the group daemon id the plugin logged.
func (c *concurrentCheck) started(t *testing.T, id string) int {
	return c.pluginLogLines(t, "MPS control daemon of a sharing group up", id)
}

// stopped counts the stops of the daemon id the plugin logged.
func (c *concurrentCheck) stopped(t *testing.T, id string) int {
	return c.pluginLogLines(t, "MPS control daemon stopped", id)
}

// checkLimits checks that h's claim's CDI spec and h's container carry the
// claim's own limits (pinned memory MiB on device 0 and active thread
// percentage) and the pipe directory of daemon id.
func (c *concurrentCheck) checkLimits(t *testing.T, h holding, id, memMiB, cores string) {
	t.Helper()
	want := map[string]string{
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=" + memMiB + "M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": cores,
		"CUDA_MPS_PIPE_DIRECTORY":           filepath.Join(c.mpsRoot, id, "pipe"),
	}
	path := claimSpec(c.cluster, h)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("CDI spec of claim %s/%s: %v", h.claim.Namespace, h.claim.Name, err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatalf("CDI spec %s: %v", path, err)
	}
	specEnv := map[string][]string{}
	edits := []cdispec.ContainerEdits{spec.ContainerEdits}
	for _, d := range spec.Devices {
		edits = append(edits, d.ContainerEdits)
	}
	for _, e := range edits {
		for _, kv := range e.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				specEnv[k] = append(specEnv[k], v)
			}
		}
	}
	for k, v := range want {
		if got := specEnv[k]; !slices.Equal(got, []string{v}) {
			t.Errorf("CDI spec %s sets %s to %q, want %q once", path, k, got, v)
		}
		if got, ok := env(h.log, k); !ok || got != v {
			t.Errorf("pod %s/%s: %s=%q (set: %t), want %q", h.pod.Namespace, h.pod.Name, k, got, ok, v)
		}
	}
}

// checkDaemonPods checks the daemon pods of namespace's group, where the
// plugin runs daemon pods (real GPUs): exactly one, on gpu, named and
// labelled as docs/mps.md says; none when gpu is zero. With simulated GPUs
// the plugin runs none, and the daemon's directory and log stand for it.
func (c *concurrentCheck) checkDaemonPods(ctx context.Context, t *testing.T, namespace string, gpu gpuview.GPU) {
	t.Helper()
	all, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=mps-control-daemon"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) == 0 {
		t.Logf("no MPS daemon pods: the plugin runs none on simulated GPUs; group %s's daemon is its directory", namespace)
		return
	}
	var names []string
	for _, p := range all.Items {
		if p.Labels[driver.Name+"/mps-group"] == namespace && p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	var want []string
	if gpu.UUID != "" {
		want = []string{daemonPodName(namespace, gpu)}
	}
	if !slices.Equal(names, want) {
		t.Errorf("daemon pods of group %s (label %s/mps-group=%s): %v, want %v", namespace, driver.Name, namespace, names, want)
	}
}

// deleteAndWait deletes h's pod and waits until it, its claim and the
// claim's CDI spec are gone (the plugin unprepared the claim).
func (c *concurrentCheck) deleteAndWait(ctx context.Context, t *testing.T, h holding) {
	t.Helper()
	namespace := h.pod.Namespace
	if err := c.client.CoreV1().Pods(namespace).Delete(ctx, h.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatalf("deleting pod %s/%s: %v", namespace, h.pod.Name, err)
	}
	spec := claimSpec(c.cluster, h)
	var state string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.alive(); err != nil {
			return false, err
		}
		if _, err := c.client.CoreV1().Pods(namespace).Get(ctx, h.pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			state = fmt.Sprintf("pod still there (%v)", err)
			return false, nil
		}
		if cl, err := c.client.ResourceV1().ResourceClaims(namespace).Get(ctx, h.claim.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			state = fmt.Sprintf("claim %s still there (%v)", h.claim.Name, err)
			if err == nil {
				state += fmt.Sprintf(": allocated %t, reserved %d, finalizers %v", cl.Status.Allocation != nil, len(cl.Status.ReservedFor), cl.Finalizers)
			}
			return false, nil
		}
		if _, err := os.Stat(spec); !errors.Is(err, os.ErrNotExist) {
			state = fmt.Sprintf("CDI spec %s still there (%v)", spec, err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("after deleting pod %s/%s: %s: %v", namespace, h.pod.Name, state, err)
	}
}
