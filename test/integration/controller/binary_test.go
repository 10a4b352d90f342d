//go:build integration

package controller_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/test/localcluster"
)

// TestBinary builds cmd/gpulink-controller and runs it against the cluster
// with leader election: it takes the Lease, serves /readyz and /metrics,
// and allocates a pod's claim.
func TestBinary(t *testing.T) {
	e := setup(t, map[string]string{"bin-v100": "v100-sxm2-8-aliyun-sccgn6.txt"})
	bin := filepath.Join(t.TempDir(), "gpulink-controller")
	build := exec.CommandContext(e.ctx, "go", "build", "-o", bin, "../../../cmd/gpulink-controller")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the controller: %v\n%s", err, out)
	}
	metrics, health := localcluster.FreePort(t), localcluster.FreePort(t)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"--kubeconfig="+cluster.Kubeconfig(),
		"--leader-elect-namespace="+e.ns,
		"--leader-elect-id=gpulink-controller-test",
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", metrics),
		fmt.Sprintf("--health-address=127.0.0.1:%d", health),
		"--v=2")
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
	get := func(port int, path string) (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	e.poll("lease taken", time.Minute, func() bool {
		l, err := e.client.CoordinationV1().Leases(e.ns).Get(e.ctx, "gpulink-controller-test", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	e.poll("/readyz", time.Minute, func() bool { code, _ := get(health, "/readyz"); return code == http.StatusOK })

	e.template("two", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
	})
	p := e.startBound(e.newPod("bin-pod", true, "two"), time.Minute)
	if w := e.weakest(e.claimsOf(p)[0]); !w.IsNVLink() {
		t.Errorf("pair with weakest link %s, want NVLink", w)
	}
	if code, body := get(health, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d %s", code, body)
	}
	_, body := get(metrics, "/metrics")
	for _, want := range []string{"gpulink_controller_allocations_total{weakest_link=", "gpulink_controller_allocation_latency_seconds_count 1", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
