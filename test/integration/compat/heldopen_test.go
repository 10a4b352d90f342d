//go:build integration

package compat_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/compat/admission"
	"github.com/gpulink/gpulink/test/localcluster"
)

// procMiB reads a field of /proc/<pid>/status (VmRSS, VmHWM) in MiB.
func procMiB(t *testing.T, pid int, field string) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kib float64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%f kB", &kib); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return kib / 1024
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestWebhookHeldOpen runs the gpulink-controller binary with the webhook
// against the cluster, as the chart does, and loads the webhook as a
// hostile peer and a busy API server would at once: 64 peers announce a
// 2 MiB review, send 1.9 MiB and stall, while 32 clients post reviews of
// a 1.5 MiB pod. Every stalled peer is cut off (the default 5 s read
// timeout), reviews beyond the limits are answered 429, and the
// controller's peak RSS over its RSS before the load is logged (the
// figure the chart's memory limit is set from) and bounded.
func TestWebhookHeldOpen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := setup(t, time.Minute)
	bin := filepath.Join(t.TempDir(), "gpulink-controller")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../../../cmd/gpulink-controller").CombinedOutput(); err != nil {
		t.Fatalf("building the controller: %v\n%s", err, out)
	}
	certDir := t.TempDir()
	caPEM := writeCert(t, certDir)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	port, health := localcluster.FreePort(t), localcluster.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig="+cluster.Kubeconfig(),
		"--leader-elect-namespace="+e.ns, "--leader-elect-id=gpulink-heldopen", "--hold-namespace="+e.ns,
		"--metrics-address=", fmt.Sprintf("--health-address=127.0.0.1:%d", health),
		"--webhook-address="+addr, "--webhook-cert-dir="+certDir)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(logFile.Name())
			t.Logf("controller log:\n%s", out)
		}
	}()
	tlsConfig := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, MaxIdleConnsPerHost: 32}, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: e.ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
	for i := range 1500 {
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: strings.Repeat("x", 1000)})
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "req", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Namespace: e.ns, Operation: admissionv1.Create, DryRun: new(true), Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	post := func() (int, error) {
		resp, err := client.Post("https://"+addr+admission.Path, "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	// Serving: the webhook answers once the ResourceQuota cache synced.
	e.poll("the controller's webhook answers", 2*time.Minute, func() bool {
		code, err := post()
		return err == nil && code == http.StatusOK
	})
	time.Sleep(2 * time.Second)
	pid := cmd.Process.Pid
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("resetting the controller's VmHWM: %v", err)
	}
	before := procMiB(t, pid, "VmRSS")

	peers := make([]*tls.Conn, 64)
	for i := range peers {
		c, err := tls.Dial("tcp", addr, tlsConfig)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", admission.Path, 2<<20)
		_, _ = c.Write(bytes.Repeat([]byte(" "), 1900<<10))
		peers[i] = c
	}
	start := time.Now()
	stop := make(chan struct{})
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if code, err := post(); err == nil {
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			}
		})
	}
	const patience = 30 * time.Second
	var slowest time.Duration
	for i, c := range peers {
		_ = c.SetReadDeadline(start.Add(patience))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("stalled peer %d still held after %s", i, patience)
		}
		slowest = max(slowest, time.Since(start))
	}
	// Load on for as long again, without the stalled peers.
	time.Sleep(slowest)
	close(stop)
	wg.Wait()
	peak := procMiB(t, pid, "VmHWM")
	t.Logf("controller RSS %.0f MiB before the load, peak %.0f MiB (+%.0f MiB); stalled peers cut off within %s; answers %v",
		before, peak, peak-before, slowest.Round(time.Millisecond), codes)
	if codes[http.StatusTooManyRequests] == 0 {
		t.Error("no review was answered 429 while 64 stalled 2 MiB peers were held: the limits are not enforced")
	}
	if codes[http.StatusOK] == 0 {
		t.Error("no review was answered once the stalled peers were cut off")
	}
	// 16 MiB of bodies at about 3.2 bytes per byte, TLS buffers and
	// goroutines of 96 connections, and the Go heap's slack.
	if growth := peak - before; growth > 150 {
		t.Errorf("the controller's RSS grew by %.0f MiB under the load, over the 150 MiB the limits allow for", growth)
	}
}
