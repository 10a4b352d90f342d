//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

// migLayout is the simulated DGX A100 (40GB) of TestMIGE2E's real node:
// GPU 0 split into a 1g.5gb and a 3g.20gb instance, GPU 1 into one
// 7g.40gb instance, GPUs 2-7 whole.
const migLayout = "0:1g.5gb,3g.20gb;1:7g.40gb"

// migCapMinors are the /dev/nvidia-caps minors of migLayout's instances in
// the mock's capability table (the driver's layout: per GPU minor 15 GPU
// instances, each access minor followed by its 8 compute instances',
// starting at 3): GPU 0's GI 0 and CI 0, GI 1 and CI 0; GPU 1's GI 0 and
// CI 0.
var migCapMinors = map[string][]int{
	"gpu-0-mig-0-0": {3, 4},
	"gpu-0-mig-1-0": {12, 13},
	"gpu-1-mig-0-0": {138, 139},
}

// TestMIGE2E runs pods on MIG devices of a simulated A100 node in MIG mode
// (the real node's kubelet plugin with --discovery=mock --mock-mig), end to
// end: a pod written for the NVIDIA device plugin's mixed MIG strategy
// (nvidia.com/mig-1g.5gb: 1 and nvidia.com/mig-3g.20gb: 1, translated by
// the webhook) gets a 1g and a 3g instance and a native claim on
// mig.gpulink.dev the 7g one; each container sees its MIG devices' UUIDs,
// its parent GPU's device node and its /dev/nvidia-caps nodes, and no
// whole GPU; whole GPUs go to the GPUs not in MIG mode only; one pod with
// a MIG container and a whole-GPU container runs both; a bad profile is
// refused at admission.
func TestMIGE2E(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	var minors []int
	for _, m := range migCapMinors {
		minors = append(minors, m...)
	}
	s := setupCompat(ctx, t, setupOptions{
		realPluginArgs: []string{"--discovery=mock", "--mock-server=dgxa100", "--mock-mig=" + migLayout},
		realDevices:    6 + 3,
		migCapMinors:   minors,
	})
	t.Logf("gpulink with a simulated MIG node deployed %.1fs after the start", time.Since(begin).Seconds())
	uuids := s.deviceUUIDs(ctx, t, s.realNode)

	t.Run("a bad MIG profile is refused at admission naming the resource", func(t *testing.T) {
		pod := s.compatPod("bad-mig", []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/mig-1g.10gbx": "1"}}})
		_, err := s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "nvidia.com/mig-1g.10gbx") || !strings.Contains(err.Error(), "not a MIG profile name") {
			t.Errorf("pod asking nvidia.com/mig-1g.10gbx: %v, want a refusal naming it", err)
		}
	})

	t.Run("nvidia.com/mig-1g.5gb and mig-3g.20gb give one container a 1g and a 3g instance", func(t *testing.T) {
		pod := s.compatPod("mig-dp", []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/mig-1g.5gb": "1", "nvidia.com/mig-3g.20gb": "1"}}})
		created, err := s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("pod %s admitted: %s", created.Name, created.Annotations[compat.AnnotationTranslated])
		h := s.waitBound(ctx, t, created.Name)
		if want := []string{"gpu-0-mig-0-0", "gpu-0-mig-1-0"}; !slices.Equal(h.Devices, want) || h.Node != s.realNode {
			t.Fatalf("claim holds %v on %s, want %v on %s", h.Devices, h.Node, want, s.realNode)
		}
		s.waitRunning(ctx, t, &h)
		s.checkMIGContainer(t, h, uuids)
	})

	t.Run("a claim on mig.gpulink.dev selecting 7g.40gb gets GPU 1's instance", func(t *testing.T) {
		_, err := s.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "mig-7g"},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: driver.DeviceClassMIG,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
						// By minimum memory: only the 7g.40gb instance has 20Gi or more left.
						Expression: `device.capacity["gpu.gpulink.dev"].memory.compareTo(quantity("20Gi")) >= 0`,
					}}},
				}}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.pod(ctx, t, "mig-7g", "mig-7g", s.realNode)
		h := s.waitBound(ctx, t, "mig-7g")
		if want := []string{"gpu-1-mig-0-0"}; !slices.Equal(h.Devices, want) {
			t.Fatalf("claim holds %v, want %v", h.Devices, want)
		}
		s.waitRunning(ctx, t, &h)
		s.checkMIGContainer(t, h, uuids)
	})

	t.Run("whole GPUs come from the GPUs not in MIG mode only", func(t *testing.T) {
		s.template(ctx, t, "six", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 6}, nil)
		s.pod(ctx, t, "six", "six", s.realNode)
		h := s.waitBound(ctx, t, "six")
		if want := []string{"gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}; !slices.Equal(h.Devices, want) {
			t.Fatalf("six whole GPUs: %v, want %v", h.Devices, want)
		}
	})
	s.deletePodsAndWait(ctx, t)

	t.Run("one pod, a MIG container and a whole-GPU container: both run on the node", func(t *testing.T) {
		pod := s.compatPod("mixed", []compatContainer{
			{name: "workload", limits: map[string]string{"nvidia.com/mig-3g.20gb": "1"}},
			{name: "second", limits: map[string]string{"nvidia.com/gpu": "1"}},
		})
		if _, err := s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		logs := s.waitContainersReady(ctx, t, "mixed", "workload", "second")
		if v, _ := env(logs["workload"], "NVIDIA_VISIBLE_DEVICES"); v != uuids["gpu-0-mig-1-0"] {
			t.Errorf("MIG container: NVIDIA_VISIBLE_DEVICES=%q, want the 3g.20gb device's %s", v, uuids["gpu-0-mig-1-0"])
		}
		v, _ := env(logs["second"], "NVIDIA_VISIBLE_DEVICES")
		var whole string
		for dev, u := range uuids {
			if u == v {
				whole = dev
			}
		}
		if whole == "" || driver.IsMIGDeviceName(whole) || whole == "gpu-0" || whole == "gpu-1" {
			t.Errorf("whole-GPU container: NVIDIA_VISIBLE_DEVICES=%q (device %q), want one GPU not in MIG mode", v, whole)
		}
	})
	s.deletePodsAndWait(ctx, t)
	t.Logf("MIG e2e took %.1fs", time.Since(begin).Seconds())
}

// waitContainersReady waits until the pod runs and each named container
// printed READY, and returns their logs.
func (s *suite) waitContainersReady(ctx context.Context, t *testing.T, name string, containers ...string) map[string]string {
	t.Helper()
	pods := s.client.CoreV1().Pods(ns)
	logs := map[string]string{}
	var state string
	err := wait.PollUntilContextTimeout(ctx, time.Second, allocTimeout+runTimeout, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase != corev1.PodRunning {
			state = fmt.Sprintf("phase %s, gates %v", p.Status.Phase, p.Spec.SchedulingGates)
			return false, nil
		}
		for _, c := range containers {
			raw, err := pods.GetLogs(name, &corev1.PodLogOptions{Container: c}).DoRaw(ctx)
			if err != nil {
				log, ferr := localcluster.ReadPodLogFile(s.cluster.PodLogDir(), p, c)
				if ferr != nil {
					state = fmt.Sprintf("log of %s: %v", c, err)
					return false, nil
				}
				raw = []byte(log)
			}
			logs[c] = string(raw)
			if !strings.Contains(logs[c], "\nREADY") {
				state = "container " + c + " not READY"
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s: %s: %v\n%s", name, state, err, describePod(ctx, s.client, ns, name))
	}
	return logs
}

// deviceUUIDs reads the uuid attribute of every gpulink device a node
// publishes, MIG devices included.
func (s *suite) deviceUUIDs(ctx context.Context, t *testing.T, node string) map[string]string {
	t.Helper()
	list, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, sl := range list.Items {
		for _, d := range sl.Spec.Devices {
			if a, ok := d.Attributes[driver.AttrUUID]; ok && a.StringValue != nil {
				out[d.Name] = *a.StringValue
			}
		}
	}
	return out
}

// checkMIGContainer checks that the container sees exactly its MIG
// devices: NVIDIA_VISIBLE_DEVICES names their MIG-<uuid>s (never a GPU's),
// /dev holds their parents' nodes and their capability nodes.
func (s *suite) checkMIGContainer(t *testing.T, h holding, uuids map[string]string) {
	t.Helper()
	visible, _ := env(h.log, "NVIDIA_VISIBLE_DEVICES")
	got := strings.Split(visible, ",")
	var want []string
	parents := map[string]bool{}
	// The workload lists /dev/nvidia-caps itself and the nodes in it.
	wantDev := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl", "/dev/nvidia-caps"}
	for _, d := range h.Devices {
		u := uuids[d]
		if !strings.HasPrefix(u, "MIG-") {
			t.Fatalf("device %s publishes uuid %q, want a MIG-<uuid>", d, u)
		}
		want = append(want, u)
		parent, _, _, err := driver.ParseMIGDeviceName(d)
		if err != nil {
			t.Fatal(err)
		}
		// The mock's GPU minors are their indexes.
		if node := "/dev/nvidia" + strconv.Itoa(parent); !parents[node] {
			parents[node] = true
			wantDev = append(wantDev, node)
		}
		for _, m := range migCapMinors[d] {
			wantDev = append(wantDev, "/dev/nvidia-caps/nvidia-cap"+strconv.Itoa(m))
		}
	}
	s.checkSeen(t, h, got, want, wantDev, "the MIG devices' UUIDs")
}

// checkSeen compares, as sets, the devices the container of h saw
// (visible, its NVIDIA_VISIBLE_DEVICES split) with want (what: whose
// UUIDs they are, for the message) and, where the node shows device
// nodes, its /dev entries with wantDev.
func (s *suite) checkSeen(t *testing.T, h holding, visible, want, wantDev []string, what string) {
	t.Helper()
	visible, want = slices.Sorted(slices.Values(visible)), slices.Sorted(slices.Values(want))
	if !slices.Equal(visible, want) {
		t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES=%s, want %s %v", h.pod.Name, strings.Join(visible, ","), what, want)
	}
	if !s.devNodes {
		return
	}
	gotDev := slices.Sorted(slices.Values(lines(h.log, "DEV ")))
	wantDev = slices.Sorted(slices.Values(wantDev))
	if !slices.Equal(gotDev, wantDev) {
		t.Errorf("pod %s: /dev entries %v, want %v", h.pod.Name, gotDev, wantDev)
	}
}
