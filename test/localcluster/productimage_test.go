//go:build integration

package localcluster_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/test/localcluster"
)

// TestProductImageRuns builds the gpulink image with make image's script,
// imports it into a real node's containerd and runs every binary of it in
// a pod as the image's default user: the cgo binaries (kubelet plugin,
// nvidia-cdi-hook) start with the image's own glibc and loader, the static
// ones start at all.
func TestProductImageRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a real node needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	ref, tar, err := localcluster.BuildProductImage(ctx, "localcluster-test")
	if err != nil {
		t.Fatalf("BuildProductImage: %v", err)
	}
	c, err := localcluster.Start(ctx, localcluster.Options{Dir: shortTempDir(t), RealNode: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	if err := c.ImportImage(ctx, tar); err != nil {
		t.Fatalf("ImportImage: %v", err)
	}

	// Each container prints something only the binary itself prints.
	checks := []struct {
		name    string
		command []string
		want    string
	}{
		{"plugin", []string{"/usr/bin/gpulink-kubeletplugin", "--help"}, "Usage of gpulink-kubeletplugin"},
		{"hook", []string{"/usr/bin/nvidia-cdi-hook", "--version"}, "NVIDIA CDI Hook"},
		{"controller", []string{"/usr/bin/gpulink-controller", "--help"}, "Usage of gpulink-controller"},
		{"cli", nil, "gpulink is a Kubernetes DRA driver"}, // the entrypoint with args only
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "image-check", Namespace: "default"},
		Spec:       corev1.PodSpec{HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever},
	}
	for _, ch := range checks {
		ctr := corev1.Container{Name: ch.name, Image: ref, ImagePullPolicy: corev1.PullNever, Command: ch.command}
		if ch.command == nil {
			ctr.Args = []string{"--help"}
		}
		pod.Spec.Containers = append(pod.Spec.Containers, ctr)
	}
	client := c.Client()
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	var p *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err = client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		t.Fatalf("waiting for pod %s to finish: %v\nstatus: %+v", pod.Name, err, p.Status)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if term := cs.State.Terminated; term == nil || term.ExitCode != 0 {
			t.Errorf("container %s did not exit 0: %+v", cs.Name, cs.State)
		}
	}
	for _, ch := range checks {
		b, err := client.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{Container: ch.name}).DoRaw(ctx)
		if err != nil {
			t.Errorf("logs of %s: %v", ch.name, err)
			continue
		}
		if !strings.Contains(string(b), ch.want) {
			t.Errorf("container %s: output lacks %q:\n%s", ch.name, ch.want, b)
		}
	}
}
