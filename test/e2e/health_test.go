//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// TestE2EHealth makes GPUs of the real node unhealthy through the plugin's
// injected-events file and checks what a user sees: the device taint in
// the ResourceSlice, the Warning event on the Node, the pod's
// allocatedResourcesStatus (KEP-4680, beta and on by default in 1.37; one
// entry per GPU of its two-GPU claim, only the failed GPU's Unhealthy), the
// next pod avoiding the tainted GPUs while the running pod keeps its GPUs
// (NoSchedule), the plugin's health metrics, and recovery clearing it all.
func TestE2EHealth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := setup(ctx, t)
	eventsFile := filepath.Join(s.realPluginDir, "health-events.jsonl")
	inject := func(lines ...string) {
		t.Helper()
		f, err := os.OpenFile(eventsFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			if _, err := f.WriteString(l + "\n"); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Pod A holds two GPUs in one claim.
	s.template(ctx, t, "one-gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 1}, nil)
	s.template(ctx, t, "two-gpus", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 2}, nil)
	s.pod(ctx, t, "health-a", "two-gpus", s.realNode)
	a := s.waitBound(ctx, t, "health-a")
	s.waitRunning(ctx, t, &a)
	if len(a.Devices) != 2 {
		t.Fatalf("pod health-a got %v, want two GPUs", a.Devices)
	}
	held, kept := a.Devices[0], a.Devices[1]
	heldID := kubeletplugin.CDIDeviceIDForDevice(a.claim.UID, held)
	keptID := kubeletplugin.CDIDeviceIDForDevice(a.claim.UID, kept)
	s.waitAllocatedHealth(ctx, t, "health-a", map[string]corev1.ResourceHealthStatus{
		heldID: corev1.ResourceHealthStatusHealthy, keptID: corev1.ResourceHealthStatusHealthy,
	})

	// One of its GPUs gets a fatal XID; every GPU it does not hold but one
	// falls off the bus, and the last one gets an application XID, which
	// changes nothing.
	node := s.nodes(ctx, t)[s.realNode]
	var others []string
	for _, g := range node.GPUs {
		if g.Device != held && g.Device != kept {
			others = append(others, g.Device)
		}
	}
	spare, lost := others[len(others)-1], others[:len(others)-1]
	lines := []string{fmt.Sprintf(`{"device":%q,"kind":"xid","xid":79,"message":"injected by e2e"}`, held)}
	for _, d := range lost {
		lines = append(lines, fmt.Sprintf(`{"device":%q,"kind":"gpu-lost"}`, d))
	}
	lines = append(lines, fmt.Sprintf(`{"device":%q,"kind":"xid","xid":13}`, spare))
	injected := time.Now()
	inject(lines...)

	wantTainted := append([]string{held}, lost...)
	s.waitTaints(ctx, t, wantTainted)
	t.Logf("%d GPUs tainted %s %.1fs after the injection", len(wantTainted), driver.UnhealthyTaintKey, time.Since(injected).Seconds())
	s.waitNodeEvent(ctx, t, "GPUUnhealthy", held)
	// Each GPU of the claim has its own entry: the failed one Unhealthy,
	// the other still Healthy.
	s.waitAllocatedHealth(ctx, t, "health-a", map[string]corev1.ResourceHealthStatus{
		heldID: corev1.ResourceHealthStatusUnhealthy, keptID: corev1.ResourceHealthStatusHealthy,
	})
	t.Logf("pod health-a shows its GPU %s Unhealthy and %s Healthy %.1fs after the injection", held, kept, time.Since(injected).Seconds())

	// The next pod gets the one healthy free GPU; pod A keeps running.
	s.pod(ctx, t, "health-b", "one-gpu", s.realNode)
	b := s.waitBound(ctx, t, "health-b")
	if len(b.Devices) != 1 || b.Devices[0] != spare {
		t.Errorf("pod health-b got %v, want the only untainted GPU %s", b.Devices, spare)
	}
	pod, err := s.client.CoreV1().Pods(ns).Get(ctx, "health-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
		t.Errorf("pod health-a on the tainted GPU: phase %s, deleting %v; NoSchedule must not disturb it", pod.Status.Phase, pod.DeletionTimestamp != nil)
	}

	// The plugin's metrics: names the dashboard uses, and the values now.
	metrics := s.scrape(ctx, t, "/metrics")
	for _, name := range []string{
		"gpulink_kubeletplugin_device_healthy",
		"gpulink_kubeletplugin_health_events_total",
		"gpulink_kubeletplugin_mps_daemons",
	} {
		if !strings.Contains(metrics, "\n"+name) {
			t.Errorf("plugin /metrics lacks %s", name)
		}
	}
	heldGPU, _ := node.GPU(held)
	for _, want := range []string{
		fmt.Sprintf(`gpulink_kubeletplugin_device_healthy{device=%q,node=%q,uuid=%q} 0`, held, s.realNode, heldGPU.UUID),
		fmt.Sprintf(`gpulink_kubeletplugin_health_events_total{device=%q,node=%q,verdict="fatal"} 1`, held, s.realNode),
		fmt.Sprintf(`gpulink_kubeletplugin_health_events_total{device=%q,node=%q,verdict="ignored"} 1`, spare, s.realNode),
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("plugin /metrics lacks %s", want)
		}
	}
	if body := s.scrape(ctx, t, "/healthz"); strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz = %q, want ok", body)
	}

	// The operator clears every GPU: taints gone, event, pod status healthy.
	var clears []string
	for _, d := range wantTainted {
		clears = append(clears, fmt.Sprintf(`{"device":%q,"kind":"recovered","message":"cleared by e2e"}`, d))
	}
	cleared := time.Now()
	inject(clears...)
	s.waitTaints(ctx, t, nil)
	s.waitNodeEvent(ctx, t, "GPURecovered", held)
	s.waitAllocatedHealth(ctx, t, "health-a", map[string]corev1.ResourceHealthStatus{
		heldID: corev1.ResourceHealthStatusHealthy, keptID: corev1.ResourceHealthStatusHealthy,
	})
	t.Logf("taints cleared and pod health-a healthy again %.1fs after the clear", time.Since(cleared).Seconds())
	s.deletePodsAndWait(ctx, t)
}

// TestE2EHealthNoExecute runs the real node's plugin with
// --health-taint-effect=NoExecute: a fatal XID on a GPU a running pod holds
// must get the pod evicted by kube-controller-manager's device taint
// eviction controller (DRADeviceTaints, GA in 1.37), its claim released and
// its CDI spec removed, and the next pod must get another GPU.
func TestE2EHealthNoExecute(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := setupOpts(ctx, t, setupOptions{realPluginArgs: []string{"--health-taint-effect=NoExecute"}})
	s.template(ctx, t, "one-gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 1}, nil)
	s.pod(ctx, t, "victim", "one-gpu", s.realNode)
	v := s.waitBound(ctx, t, "victim")
	s.waitRunning(ctx, t, &v)
	held := v.Devices[0]

	line := fmt.Sprintf(`{"device":%q,"kind":"xid","xid":79,"message":"injected by e2e"}`, held)
	f, err := os.OpenFile(filepath.Join(s.realPluginDir, "health-events.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	injected := time.Now()
	s.waitTaintsWith(ctx, t, []string{held}, resourceapi.DeviceTaintEffectNoExecute)

	// Evicted: kube-controller-manager deletes the pod and says why in a
	// DisruptionTarget condition; then the claim and the CDI spec go.
	var reason string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		pod, err := s.client.CoreV1().Pods(ns).Get(ctx, "victim", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				reason = c.Reason + ": " + c.Message
			}
		}
		return pod.DeletionTimestamp != nil, nil
	})
	if err != nil {
		t.Fatalf("pod victim on %s (tainted NoExecute) was not evicted: %v", held, err)
	}
	t.Logf("pod victim evicted %.1fs after the injection (%s)", time.Since(injected).Seconds(), reason)
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if _, err := s.client.ResourceV1().ResourceClaims(ns).Get(ctx, v.claim.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		entries, err := os.ReadDir(s.cluster.CDIDir())
		if err != nil {
			return false, err
		}
		for _, e := range entries {
			if strings.Contains(e.Name(), string(v.claim.UID)) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("claim %s of the evicted pod or its CDI spec is still there: %v", v.claim.Name, err)
	}

	s.pod(ctx, t, "next", "one-gpu", s.realNode)
	n := s.waitBound(ctx, t, "next")
	s.waitRunning(ctx, t, &n)
	if n.Devices[0] == held {
		t.Errorf("pod next got the NoExecute-tainted GPU %s", held)
	}
	s.deletePodsAndWait(ctx, t)
}

// waitTaints waits until exactly the devices in want carry the unhealthy
// taint (NoSchedule) on the real node.
func (s *suite) waitTaints(ctx context.Context, t *testing.T, want []string) {
	t.Helper()
	s.waitTaintsWith(ctx, t, want, resourceapi.DeviceTaintEffectNoSchedule)
}

// waitTaintsWith is waitTaints for a taint effect.
func (s *suite) waitTaintsWith(ctx context.Context, t *testing.T, want []string, effect resourceapi.DeviceTaintEffect) {
	t.Helper()
	want = slices.Clone(want)
	gpuview.SortDevices(want)
	var got []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		list, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + s.realNode})
		if err != nil {
			return false, err
		}
		got = nil
		for _, sl := range list.Items {
			for _, d := range sl.Spec.Devices {
				for _, taint := range d.Taints {
					if taint.Key == driver.UnhealthyTaintKey && taint.Effect == effect && taint.Value != "" {
						got = append(got, d.Name)
					}
				}
			}
		}
		gpuview.SortDevices(got)
		return slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("unhealthy %s taints on %v, want on %v: %v", effect, got, want, err)
	}
}

// waitNodeEvent waits for an event with reason on the real node naming
// device.
func (s *suite) waitNodeEvent(ctx context.Context, t *testing.T, reason, device string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := s.client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			return false, err
		}
		seen = nil
		for _, e := range list.Items {
			seen = append(seen, e.Regarding.Kind+"/"+e.Regarding.Name+": "+e.Note)
			if e.Regarding.Kind == "Node" && e.Regarding.Name == s.realNode && strings.Contains(e.Note, "GPU "+device+" ") {
				t.Logf("event %s %s on node %s: %s", e.Type, e.Reason, e.Regarding.Name, e.Note)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event on node %s for %s (seen: %v): %v", reason, s.realNode, device, seen, err)
	}
}

// waitAllocatedHealth waits until the pod's container status reports
// exactly the given health per resource ID for its claim. The kubelet names
// a device by its first CDI device ID, which gpulink makes the GPU's own
// CDI device (kubeletplugin.CDIDeviceIDForDevice), so each GPU of the
// claim has its own entry.
func (s *suite) waitAllocatedHealth(ctx context.Context, t *testing.T, podName string, want map[string]corev1.ResourceHealthStatus) {
	t.Helper()
	var got map[string]corev1.ResourceHealthStatus
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err := s.client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if len(pod.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		got = map[string]corev1.ResourceHealthStatus{}
		for _, rs := range pod.Status.ContainerStatuses[0].AllocatedResourcesStatus {
			if !strings.HasPrefix(string(rs.Name), "claim:") {
				continue
			}
			for _, r := range rs.Resources {
				got[string(r.ResourceID)] = r.Health
			}
		}
		return maps.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("pod %s: allocatedResourcesStatus %v, want %v: %v", podName, got, want, err)
	}
}

// scrape GETs path from the real node's plugin.
func (s *suite) scrape(ctx context.Context, t *testing.T, path string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.realPluginHTTP+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, body)
	}
	return string(body)
}
