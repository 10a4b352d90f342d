//go:build integration

package kubeletplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/test/localcluster"
)

// TestKubeletPluginRealNode registers the plugin with a real kubelet
// (containerd v2 with CDI) and runs pods on pre-allocated claims: the
// kubelet prepares them through the plugin, containerd applies the CDI
// specs, and the container sees exactly its claim's GPUs.
func TestKubeletPluginRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a real node (containerd, kubelet) needs root")
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()

	dir, err := localcluster.MkdirTemp("glkr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cluster := localcluster.StartForTest(ctx, t, dir, localcluster.Options{RealNode: true})
	client := cluster.Client()
	nodeName := cluster.NodeName()

	// Stand-ins for the NVIDIA device nodes: character devices with
	// /dev/null's numbers, so containerd can create them in containers.
	driverRoot := filepath.Join(dir, "driver")
	devNodes := localcluster.MkDeviceNodes(t, driverRoot, 8)

	// A fake driver install in the same root: the base CDI spec mounts its
	// files and runs the real nvidia-cdi-hook hooks against them.
	driverFiles := localcluster.WriteFakeDriver(t, driverRoot)
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(binDir, "nvidia-cdi-hook")
	if _, err := os.Stat(hook); err != nil {
		t.Fatalf("nvidia-cdi-hook not built (make build): %v", err)
	}

	root := cluster.KubeletRootDir()
	startPlugin(ctx, t, client, pluginSetup{
		baseSpec:     &kubeletplugin.BaseSpecOptions{HookPath: hook},
		nodeName:     nodeName,
		pluginDir:    filepath.Join(root, "plugins", driver.Name),
		registrarDir: filepath.Join(root, "plugins_registry"),
		cdiDir:       cluster.CDIDir(),
		driverRoot:   driverRoot,
		mpsRoot:      filepath.Join(dir, "mps"),
	})
	devices := waitForSlices(ctx, t, client, nodeName)
	createDeviceClass(ctx, t, client)

	whole := allocatedClaim(ctx, t, client, nodeName, "whole", []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-1"},
		{Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-2"},
	})
	shareID := types.UID("0c5e8f2a-3b4d-4e6f-8a9b-0c1d2e3f4a5b")
	share := allocatedClaim(ctx, t, client, nodeName, "share", []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-6", ShareID: &shareID,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			driver.CapacityMemory: resource.MustParse("3Gi"),
			driver.CapacityCores:  resource.MustParse("30"),
		},
	}})

	// libcuda.so is the link the create-symlinks hook makes in the
	// container: present only if the hooks ran.
	hookLink := "/usr/lib/x86_64-linux-gnu/libcuda.so"
	wholeLog := runWorkload(ctx, t, cluster, "whole-pod", whole.Name, append(driverFiles, hookLink)...)
	uuid1, uuid2 := attrString(devices, "gpu-1", driver.AttrUUID), attrString(devices, "gpu-2", driver.AttrUUID)
	wantLines := []string{"ENV NVIDIA_VISIBLE_DEVICES=" + uuid1 + "," + uuid2, "ENV CUDA_DEVICE_ORDER=PCI_BUS_ID"}
	for _, f := range append(driverFiles, hookLink) {
		wantLines = append(wantLines, "FILE "+f)
	}
	if devNodes {
		wantLines = append(wantLines, "DEV /dev/nvidia1", "DEV /dev/nvidia2", "DEV /dev/nvidiactl", "DEV /dev/nvidia-uvm")
	}
	checkLines(t, "whole-pod", wholeLog, wantLines, []string{"DEV /dev/nvidia0", "DEV /dev/nvidia6", "ENV CUDA_MPS", "NOFILE"})

	shareLog := runWorkload(ctx, t, cluster, "share-pod", share.Name)
	wantLines = []string{
		"ENV NVIDIA_VISIBLE_DEVICES=" + attrString(devices, "gpu-6", driver.AttrUUID),
		"ENV CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M",
		"ENV CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
		// One MPS daemon (here: its directories) per claim.
		"ENV CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(dir, "mps", string(share.UID), "pipe"),
	}
	if devNodes {
		wantLines = append(wantLines, "DEV /dev/nvidia6")
	}
	checkLines(t, "share-pod", shareLog, wantLines, []string{"DEV /dev/nvidia1"})

	// Deleting the pods makes the kubelet unprepare: the specs go away.
	for _, name := range []string{"whole-pod", "share-pod"} {
		if err := client.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		entries, err := os.ReadDir(cluster.CDIDir())
		if err != nil {
			return false, err
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), driver.Name+"-claim_") {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("CDI specs not removed after the pods were deleted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "mps", string(share.UID))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("MPS directories of the unprepared share claim left behind: %v", err)
	}
}

// runWorkload runs the workload image with a claim and returns its log
// once it printed READY.
// files are paths the workload reports as present or missing.
func runWorkload(ctx context.Context, t *testing.T, cluster *localcluster.Cluster, name, claim string, files ...string) string {
	t.Helper()
	client := cluster.Client()
	pods := client.CoreV1().Pods(metav1.NamespaceDefault)
	created, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           localcluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				Env:             []corev1.EnvVar{{Name: "GPULINK_WORKLOAD_FILES", Value: strings.Join(files, ",")}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var log string
	var logErr error
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		raw, err := pods.GetLogs(name, &corev1.PodLogOptions{Container: "workload"}).DoRaw(ctx)
		if err == nil {
			log = string(raw)
			return strings.Contains(log, "READY"), nil
		}
		// The API server could not fetch the log from the kubelet:
		// read the kubelet's log file directly.
		logErr = err
		log, err = localcluster.ReadPodLogFile(cluster.PodLogDir(), created, "workload")
		if err != nil {
			logErr = errors.Join(logErr, err)
			return false, nil
		}
		return strings.Contains(log, "READY"), nil
	})
	if err != nil {
		pod, _ := pods.Get(ctx, name, metav1.GetOptions{})
		events, _ := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		var msgs []string
		if events != nil {
			for _, e := range events.Items {
				msgs = append(msgs, e.Reason+": "+e.Message)
			}
		}
		t.Fatalf("pod %s never printed READY: %v; last log error: %v; log so far:\n%s\nphase %s; events %v", name, err, logErr, log, pod.Status.Phase, msgs)
	}
	t.Logf("%s log:\n%s", name, log)
	return log
}

func checkLines(t *testing.T, pod, log string, want, unwanted []string) {
	t.Helper()
	lines := strings.Split(log, "\n")
	has := func(prefix string) bool {
		for _, l := range lines {
			if l == prefix || strings.HasPrefix(l, prefix) {
				return true
			}
		}
		return false
	}
	for _, w := range want {
		if !has(w) {
			t.Errorf("%s: no line %q in\n%s", pod, w, log)
		}
	}
	for _, u := range unwanted {
		if has(u) {
			t.Errorf("%s: unexpected line %q", pod, u)
		}
	}
}
