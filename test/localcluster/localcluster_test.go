//go:build integration

package localcluster_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/test/localcluster"
)

// shortTempDir returns a short state directory: t.TempDir() paths of long
// test names can exceed the Unix socket path limit.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	return dir
}

func TestRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a real node needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	start := time.Now()
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: shortTempDir(t), RealNode: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %.1fs", time.Since(start).Seconds())
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if err := c.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
		}
	})
	client := c.Client()

	node, err := client.CoreV1().Nodes().Get(ctx, c.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting node: %v", err)
	}
	if !nodeReady(node) {
		t.Fatalf("node %s is not Ready: %+v", node.Name, node.Status.Conditions)
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == corev1.TaintNodeNotReady {
			t.Fatalf("node %s still has taint %v", node.Name, taint)
		}
	}
	for _, d := range []string{c.CDIDir(), filepath.Join(c.KubeletRootDir(), "plugins_registry"), filepath.Join(c.KubeletRootDir(), "plugins")} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("directory: %v", err)
		}
	}
	if _, err := os.Stat(c.ContainerdSocket()); err != nil {
		t.Errorf("containerd socket: %v", err)
	}

	podStart := time.Now()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "workload",
			Namespace: "default",
		},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr(int64(2)),
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           localcluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Env:             []corev1.EnvVar{{Name: "SMOKE_TEST", Value: "hello"}},
			}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	var logs string
	var logErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, "workload", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod failed: %+v", p.Status)
		}
		if p.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		b, err := client.CoreV1().Pods("default").GetLogs("workload", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			logErr = err
			return false, nil
		}
		logs = string(b)
		return strings.Contains(logs, "READY"), nil
	})
	if err != nil {
		p, _ := client.CoreV1().Pods("default").Get(ctx, "workload", metav1.GetOptions{})
		t.Fatalf("waiting for the workload pod's logs: %v (last error getting logs: %v)\npod status: %+v\nkubelet log: %s", err, logErr, p.Status, c.LogPath("kubelet"))
	}
	t.Logf("pod running with logs %.1fs after create", time.Since(podStart).Seconds())
	for _, want := range []string{"ENV SMOKE_TEST=hello", "ENV HOSTNAME=", "READY"} {
		if !strings.Contains(logs, want) {
			t.Errorf("pod log lacks %q:\n%s", want, logs)
		}
	}

	stopStart := time.Now()
	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("Stop took %.1fs", time.Since(stopStart).Seconds())
}

func TestAPINode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: shortTempDir(t), Logf: t.Logf})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	if err := c.AddAPINode(ctx, "api-node-1"); err != nil {
		t.Fatal(err)
	}
	client := c.Client()
	node, err := client.CoreV1().Nodes().Get(ctx, "api-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !nodeReady(node) || len(node.Spec.Taints) != 0 {
		t.Fatalf("API node not Ready or tainted: conditions %+v taints %+v", node.Status.Conditions, node.Spec.Taints)
	}
	if got := node.Status.Allocatable.Pods().Value(); got != 110 {
		t.Errorf("allocatable pods = %d, want 110", got)
	}

	// kube-scheduler binds a pod to the API node (it never runs there).
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "scheduled", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: localcluster.WorkloadImage, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, "scheduled", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Spec.NodeName == "api-node-1", nil
	})
	if err != nil {
		t.Fatalf("pod was not bound to api-node-1: %v", err)
	}

	// resource.k8s.io/v1 is served.
	if _, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing ResourceSlices: %v", err)
	}
	if _, err := os.Stat(c.Kubeconfig()); err != nil {
		t.Errorf("kubeconfig: %v", err)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
