package controller

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulink/gpulink/internal/profiling/profilingtest"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestHealthHandler(t *testing.T) {
	var ready atomic.Bool
	var liveErr error
	h := HealthHandler(func(*http.Request) error { return liveErr }, ready.Load)
	get := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	if got := get("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz before sync = %d, want 503", got)
	}
	ready.Store(true)
	if got := get("/readyz"); got != http.StatusOK {
		t.Errorf("/readyz after sync = %d, want 200", got)
	}
	if got := get("/healthz"); got != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", got)
	}
	liveErr = errors.New("lease not renewed")
	if got := get("/healthz"); got != http.StatusInternalServerError {
		t.Errorf("/healthz with a stuck leader = %d, want 500", got)
	}
}

func TestMetricsHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Allocations.WithLabelValues("NV2").Inc()
	m.PendingPods.Set(3)
	rec := httptest.NewRecorder()
	MetricsHandler(reg, false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
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
	get := profilingtest.Get
	for _, profiling := range []bool{false, true} {
		h := MetricsHandler(reg, profiling)
		if code, body := get(h, "/metrics"); code != http.StatusOK || !strings.Contains(body, "gpulink_controller_pending_pods") {
			t.Errorf("profiling=%v: /metrics = %d, want 200 with the controller's metrics", profiling, code)
		}
		profilingtest.CheckServed(t, h, profiling)
	}
}

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
