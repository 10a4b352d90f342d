package main

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpulink/gpulink/internal/serve/servetest"
	"github.com/prometheus/client_golang/prometheus"
)

func TestParseFlagsDefaults(t *testing.T) {
	t.Setenv("NODE_NAME", "node-from-env")
	f, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ got, want any }{
		"node-name":             {f.nodeName, "node-from-env"},
		"discovery":             {f.discovery.Backend, "nvml"},
		"cdi-root":              {f.cdiRoot, "/var/run/cdi"},
		"kubelet-registrar-dir": {f.registrarDir, "/var/lib/kubelet/plugins_registry"},
		"kubelet-plugin-dir":    {f.pluginDir, "/var/lib/kubelet/plugins/gpu.gpulink.dev"},
		"managed-by-controller": {f.managedByController, true},
		"mps-root":              {f.mpsRoot, "/run/gpulink/mps"},
		"driver-root":           {f.driverRoot, "/"},
		"default-share-memory":  {f.defaultShareMemory, "4Gi"},
		"default-share-cores":   {f.defaultShareCores, int64(25)},
		"metrics-address":       {f.metricsAddress, ":8080"},
		"profiling":             {f.profiling, false},
		"boot-id-file":          {f.bootIDFile, "/proc/sys/kernel/random/boot_id"},
		"rediscover-interval":   {f.rediscoverInterval, time.Minute},
		"kubeconfig":            {f.kubeconfig, ""},
	} {
		if tc.got != tc.want {
			t.Errorf("--%s default %v, want %v", name, tc.got, tc.want)
		}
	}
}

func TestParseFlagsTopologyFile(t *testing.T) {
	f, err := parseFlags([]string{
		"--node-name=n1", "--discovery=topology-file", "--topology-file=/etc/topo.txt",
		"--gpu-product=NVIDIA H100 80GB HBM3", "--gpu-memory=80Gi", "--managed-by-controller=false",
		"--metrics-address=", "-v=4",
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.discovery.NodeName != "n1" || f.discovery.TopologyFile != "/etc/topo.txt" || f.discovery.GPUProduct != "NVIDIA H100 80GB HBM3" ||
		f.gpuMemory != "80Gi" || f.managedByController || f.metricsAddress != "" {
		t.Errorf("parsed %+v", f)
	}
	if _, err := parseFlags([]string{"--no-such-flag"}); err == nil {
		t.Error("unknown flag accepted")
	}
	if _, err := parseFlags([]string{"stray"}); err == nil {
		t.Error("positional argument accepted")
	}
}

func TestHealthFlags(t *testing.T) {
	f, err := parseFlags([]string{"--kubelet-plugin-dir=/p"})
	if err != nil {
		t.Fatal(err)
	}
	if f.healthEventsFile != "/p/health-events.jsonl" {
		t.Errorf("--health-events-file default %q", f.healthEventsFile)
	}
	o, err := f.healthOptions()
	if err != nil || o == nil {
		t.Fatalf("default health options: %v, %v", o, err)
	}
	if o.TaintEffect != "NoSchedule" || len(o.Policy.FatalXIDs) == 0 || len(o.Policy.IgnoredXIDs) == 0 {
		t.Errorf("default health options %+v", o)
	}
	f, _ = parseFlags([]string{"--health=false"})
	if o, err := f.healthOptions(); o != nil || err != nil {
		t.Errorf("--health=false: %v, %v", o, err)
	}
	for args, want := range map[string]string{
		"--health-fatal-xids=48,x":               "--health-fatal-xids",
		"--health-ignored-xids=-3":               "--health-ignored-xids",
		"--health-taint-effect=PreferNoSchedule": "--health-taint-effect",
		"--health-poll-interval=0s":              "--health-poll-interval",
		"--health-fatal-xids=13":                 "XID 13 is listed both",
	} {
		f, err := parseFlags([]string{args})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.healthOptions(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error containing %q", args, err, want)
		}
	}
	f, _ = parseFlags([]string{"--health-taint-effect=NoExecute", "--health-fatal-xids=79", "--health-ignored-xids="})
	o, err = f.healthOptions()
	if err != nil || o.TaintEffect != "NoExecute" || len(o.Policy.FatalXIDs) != 1 || len(o.Policy.IgnoredXIDs) != 0 {
		t.Errorf("custom health options %+v, %v", o, err)
	}
}

// The metrics port serves /debug/pprof/ only with --profiling; /metrics,
// /healthz and /readyz either way.
func TestMetricsHandlerProfiling(t *testing.T) {
	f, err := parseFlags([]string{"--profiling"})
	if err != nil || !f.profiling {
		t.Fatalf("--profiling: %v, %v", f, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "gpulink_test_total"}))
	var healthErr error
	get := servetest.Get
	for _, profiling := range []bool{false, true} {
		registered := false
		h := metricsHandler(reg, func() error { return healthErr }, func() bool { return registered }, profiling)
		if code, body := get(h, "/metrics"); code != http.StatusOK || !strings.Contains(body, "gpulink_test_total") {
			t.Errorf("profiling=%v: /metrics = %d %q", profiling, code, body)
		}
		healthErr = nil
		if code, _ := get(h, "/healthz"); code != http.StatusOK {
			t.Errorf("profiling=%v: /healthz = %d, want 200", profiling, code)
		}
		healthErr = errors.New("NVML broken")
		if code, _ := get(h, "/healthz"); code != http.StatusServiceUnavailable {
			t.Errorf("profiling=%v: /healthz with a broken health source = %d, want 503", profiling, code)
		}
		if code, _ := get(h, "/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("profiling=%v: /readyz before the registration = %d, want 503", profiling, code)
		}
		registered = true
		if code, _ := get(h, "/readyz"); code != http.StatusOK {
			t.Errorf("profiling=%v: /readyz once registered = %d, want 200", profiling, code)
		}
		servetest.CheckServed(t, h, profiling)
	}
}
