package kubeletplugin

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
)

// TestNodeMetricsLabelEverySeries checks that the binary's registration
// puts the node label on every series of the plugin exactly once, the
// info series' own included, so that dashboards can take one value per
// node when two plugin pods of a node are scraped during a rolling update.
func TestNodeMetricsLabelEverySeries(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d, reg := startWithRegistry(t, e)
	mustPrepare(t, d, reservedFor(newClaim("train", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 0)}), "trainer-0"))
	// Series that exist only once something happened.
	d.metrics.HealthEvents.WithLabelValues("gpu-1", "warning").Inc()
	d.metrics.DeviceHealthy.WithLabelValues("gpu-1", d.topo.GPUs[1].UUID).Set(1)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		seen[f.GetName()] = true
		for _, m := range f.GetMetric() {
			var nodes []string
			for _, l := range m.GetLabel() {
				if l.GetName() == NodeLabel {
					nodes = append(nodes, l.GetValue())
				}
			}
			if len(nodes) != 1 || nodes[0] != e.opts.NodeName {
				t.Errorf("%s %v: node labels %q, want one, %q", f.GetName(), m.GetLabel(), nodes, e.opts.NodeName)
			}
		}
	}
	for _, name := range []string{PreparedGPUInfoName, "gpulink_kubeletplugin_prepared_claims", "gpulink_kubeletplugin_claim_duration_seconds",
		"gpulink_kubeletplugin_health_events_total", "gpulink_kubeletplugin_device_healthy", "gpulink_kubeletplugin_mps_daemons"} {
		if !seen[name] {
			t.Errorf("%s not gathered", name)
		}
	}

	// NewMetrics, for tests and other embedders, adds no label.
	plain := prometheus.NewRegistry()
	NewMetrics(plain).PreparedClaims.Set(1)
	families, err = plain.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "gpulink_kubeletplugin_prepared_claims" && len(f.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("NewMetrics labels prepared_claims with %v", f.GetMetric()[0].GetLabel())
		}
	}
}
