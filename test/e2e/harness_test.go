//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/test/localcluster"
)

// readDeviceClasses parses the DeviceClasses of a multi-document YAML file.
func readDeviceClasses(path string) ([]resourceapi.DeviceClass, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var classes []resourceapi.DeviceClass
	for _, doc := range yamlDocs(data) {
		var dc resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if dc.Kind != "DeviceClass" {
			return nil, fmt.Errorf("%s: unexpected kind %q", path, dc.Kind)
		}
		classes = append(classes, dc)
	}
	return classes, nil
}

// yamlDocs splits a multi-document YAML stream, dropping documents that
// hold nothing but comments.
func yamlDocs(data []byte) []string {
	var docs []string
	for _, doc := range strings.Split("\n"+string(data), "\n---") {
		if strings.TrimSpace(stripComments(doc)) != "" {
			docs = append(docs, doc)
		}
	}
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// podLog returns the workload container's log once it printed READY,
// through the API server or, failing that, from the kubelet's log file.
func podLog(ctx context.Context, cluster *localcluster.Cluster, pod *corev1.Pod) (string, error) {
	pods := cluster.Client().CoreV1().Pods(pod.Namespace)
	raw, err := pods.GetLogs(pod.Name, &corev1.PodLogOptions{Container: "workload"}).DoRaw(ctx)
	if err == nil {
		return string(raw), nil
	}
	log, fileErr := localcluster.ReadPodLogFile(cluster.PodLogDir(), pod, "workload")
	if fileErr != nil {
		return "", fmt.Errorf("API: %v; %w", err, fileErr)
	}
	return log, nil
}

// describePod summarizes a pod and its events for failure messages.
func describePod(ctx context.Context, client kubernetes.Interface, ns, name string) string {
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("pod %s/%s: %v", ns, name, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s/%s: phase %s, node %q, gates %v", ns, name, pod.Status.Phase, pod.Spec.NodeName, pod.Spec.SchedulingGates)
	for _, c := range pod.Status.Conditions {
		fmt.Fprintf(&b, "\n  condition %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			fmt.Fprintf(&b, "\n  container %s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
		}
	}
	events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "\n  event %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

// lines returns the log's lines with the given prefix, prefix removed.
func lines(log, prefix string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), prefix); ok {
			out = append(out, rest)
		}
	}
	return out
}

// env returns the value of the environment variable in the workload's log.
func env(log, name string) (string, bool) {
	for _, kv := range lines(log, "ENV ") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// testDir makes a short temporary directory for a test's cluster (Unix
// socket paths must stay below 108 bytes) with a logs directory in it. It
// is removed after a passing test and kept, with hint saying where to
// look, after a failing one.
func testDir(t *testing.T, prefix, hint string) (dir, logDir string) {
	t.Helper()
	dir, err := localcluster.MkdirTemp(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("keeping %s for inspection (%s)", dir, hint)
			return
		}
		_ = os.RemoveAll(dir)
	})
	logDir = filepath.Join(dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, logDir
}
