//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/gpulink/gpulink/test/localcluster"
)

// TestE2EMPSDaemonDevicePlugin runs the real node's kubelet plugin with
// its MPS daemon device plugin on (as it is with real GPUs, where the MPS
// daemon pods need it): the real kubelet registers it, the node's capacity
// shows one resource per GPU with the plugin's slots, and unprivileged
// pods shaped like the daemon pods (no privilege escalation, every
// capability dropped) asking for one GPU's resource are admitted by the
// kubelet and see exactly that GPU's device node and the control nodes,
// given by the container runtime from the stand-in /dev/nvidia* nodes.
//
// The kubelet keeps its device plugin socket at
// /var/lib/kubelet/device-plugins whatever its --root-dir, so this test
// shares that directory with any other local node started on the machine
// while it runs (make test-integration runs the tests one at a time): a
// kubelet started later takes kubelet.sock over.
func TestE2EMPSDaemonDevicePlugin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := setupOpts(ctx, t, setupOptions{mpsDevicePlugin: true})
	if !s.devNodes {
		t.Skip("mknod is not permitted here: no stand-in device nodes for the device plugin to hand out")
	}

	// The kubelet publishes what the device plugin advertises.
	var capacity corev1.ResourceList
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := s.client.CoreV1().Nodes().Get(ctx, s.realNode, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		capacity = node.Status.Capacity
		for i := range 8 {
			if q, ok := capacity[mps.DaemonResourceName(i)]; !ok || q.Value() != mps.DefaultDaemonSlots {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("node %s capacity %v: want %d of each %s/gpu-0..7: %v", s.realNode, capacity, mps.DefaultDaemonSlots, mps.DaemonResourceDomain, err)
	}
	t.Logf("node capacity shows %s/gpu-0..7, %d slots each", mps.DaemonResourceDomain, mps.DefaultDaemonSlots)

	for _, gpu := range []int{0, 5} {
		name := fmt.Sprintf("mps-daemon-like-%d", gpu)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "gpulink-e2e"}},
			Spec: corev1.PodSpec{
				// Bound directly, as the daemon pods are: the kubelet's
				// admission, not the scheduler, checks the resource.
				NodeName:                      s.realNode,
				HostNetwork:                   true,
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{
					Name:            "workload",
					Image:           localcluster.WorkloadImage,
					ImagePullPolicy: corev1.PullNever,
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
						mps.DaemonResourceName(gpu): resource.MustParse("1"),
					}},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
				}},
			},
		}
		created, err := s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating pod %s: %v", name, err)
		}
		var log string
		err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, runTimeout, true, func(ctx context.Context) (bool, error) {
			p, err := s.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Status.Phase == corev1.PodFailed {
				return false, fmt.Errorf("pod %s failed: %s %s", name, p.Status.Reason, p.Status.Message)
			}
			if p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			l, err := podLog(ctx, s.cluster, created)
			if err != nil || !strings.Contains(l, "READY") {
				return false, nil
			}
			log = l
			return true, nil
		})
		if err != nil {
			t.Fatalf("pod %s: %v\n%s", name, err, describePod(ctx, s.client, ns, name))
		}
		devs := lines(log, "DEV ")
		want := []string{fmt.Sprintf("/dev/nvidia%d", gpu), "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}
		slices.Sort(want)
		if !slices.Equal(devs, want) {
			t.Errorf("unprivileged pod asking for %s sees %v, want exactly %v", mps.DaemonResourceName(gpu), devs, want)
		} else {
			t.Logf("unprivileged pod asking for %s admitted by the kubelet, sees %v", mps.DaemonResourceName(gpu), devs)
		}
	}
	for _, gpu := range []int{0, 5} {
		_ = s.client.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("mps-daemon-like-%d", gpu), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
}
