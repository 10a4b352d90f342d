package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpulink/gpulink/internal/serve"
	"github.com/gpulink/gpulink/internal/serve/servetest"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestRunLeadingTakesLeaseAndStops(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	led := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- RunLeading(ctx, client, LeaderElection{Namespace: "gpulink-system", Name: "gpulink-controller",
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond},
			func(ctx context.Context) {
				close(led)
				<-ctx.Done()
			})
	}()
	select {
	case <-led:
	case <-time.After(10 * time.Second):
		t.Fatal("never became leader")
	}
	lease, err := client.CoordinationV1().Leases("gpulink-system").Get(ctx, "gpulink-controller", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("lease %+v, err %v: want one held by this process", lease, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("RunLeading after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunLeading did not return after cancel")
	}
}

func TestMetricsHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Allocations.WithLabelValues("NV2").Inc()
	m.PendingPods.Set(3)
	rec := httptest.NewRecorder()
	serve.Metrics(reg, false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{`gpulink_controller_allocations_total{weakest_link="NV2"} 1`, "gpulink_controller_pending_pods 3", "gpulink_controller_allocation_latency_seconds"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics output lacks %q", want)
		}
	}
}

// /debug/pprof/ is served next to /metrics only with --profiling.
func TestMetricsHandlerProfiling(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	get := servetest.Get
	for _, profiling := range []bool{false, true} {
		h := serve.Metrics(reg, profiling)
		if code, body := get(h, "/metrics"); code != http.StatusOK || !strings.Contains(body, "gpulink_controller_pending_pods") {
			t.Errorf("profiling=%v: /metrics = %d, want 200 with the controller's metrics", profiling, code)
		}
		servetest.CheckServed(t, h, profiling)
	}
}
