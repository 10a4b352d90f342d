//go:build e2e

package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpulink/gpulink/test/localcluster"
)

// Metric names the e2e test expects on /metrics. Every vector exports its
// series at 0 from the start, or (allocations_total, below_best_link_total)
// once the controller has seen a node's slices.
var (
	controllerMetricNames = []string{
		"gpulink_controller_decisions_total",
		"gpulink_controller_decision_duration_seconds",
		"gpulink_controller_gate_wait_seconds",
		"gpulink_controller_allocation_latency_seconds",
		"gpulink_controller_allocations_total",
		"gpulink_controller_below_best_link_total",
		"gpulink_controller_pending_pods",
		"gpulink_controller_errors_total",
		"gpulink_controller_gpus",
		"gpulink_controller_shares",
		"gpulink_controller_share_memory_bytes",
		"gpulink_controller_gpu_memory_bytes",
		"gpulink_controller_fragmented_gpus",
		"gpulink_controller_released_allocations_total",
		"gpulink_controller_gangs_placed_total",
		"gpulink_controller_gang_wait_seconds",
		"gpulink_controller_gang_reservations_total",
		"gpulink_controller_gang_reserved_nodes",
	}
	pluginMetricNames = []string{
		"gpulink_kubeletplugin_claim_duration_seconds",
		"gpulink_kubeletplugin_claim_errors_total",
		"gpulink_kubeletplugin_prepared_claims",
		"gpulink_kubeletplugin_checkpoint_corruptions_total",
		"gpulink_kubeletplugin_resourceslice_publications_total",
		"gpulink_kubeletplugin_background_errors_total",
	}
)

// scrape is one /metrics answer: the families by name (from the # TYPE
// lines) and the sample lines.
type scrape struct {
	families map[string]string
	samples  []string
}

func scrapeMetrics(ctx context.Context, url string) (*scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	s := &scrape{families: map[string]string{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) == 2 {
				s.families[f[0]] = f[1]
			}
			continue
		}
		if line != "" && !strings.HasPrefix(line, "#") {
			s.samples = append(s.samples, line)
		}
	}
	return s, sc.Err()
}

// value returns the value of the sample of metric whose labels include
// every one of labels (`name="value"` each).
func (s *scrape) value(metric string, labels ...string) (float64, bool) {
	for _, line := range s.samples {
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if !all {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		return v, err == nil
	}
	return 0, false
}

func (s *scrape) missing(names []string) []string {
	var out []string
	for _, n := range names {
		if _, ok := s.families[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// checkMetrics scrapes the controller and the real node's plugin once,
// after the pod h runs with two whole GPUs of the real node.
func (s *suite) checkMetrics(ctx context.Context, t *testing.T, h holding) {
	ctrl, err := scrapeMetrics(ctx, s.controllerMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if m := ctrl.missing(controllerMetricNames); len(m) > 0 {
		t.Errorf("the controller's /metrics lacks %v", m)
	}
	node := fmt.Sprintf("node=%q", h.Node)
	if v, ok := ctrl.value("gpulink_controller_gpus", node, `state="allocated"`); !ok || v < 2 {
		t.Errorf("gpulink_controller_gpus{%s,state=allocated} = %v (found %v), want >= 2 with pod %s holding %v", node, v, ok, h.pod.Name, h.Devices)
	}
	if v, ok := ctrl.value("gpulink_controller_decisions_total", `outcome="allocated"`); !ok || v < 1 {
		t.Errorf("gpulink_controller_decisions_total{outcome=allocated} = %v (found %v), want >= 1", v, ok)
	}
	if v, ok := ctrl.value("gpulink_controller_gate_wait_seconds_count"); !ok || v < 1 {
		t.Errorf("gpulink_controller_gate_wait_seconds_count = %v (found %v), want >= 1", v, ok)
	}
	if _, ok := ctrl.value("gpulink_controller_fragmented_gpus", node, `size="2"`); !ok {
		t.Errorf("no gpulink_controller_fragmented_gpus{%s,size=2}", node)
	}
	plugin, err := scrapeMetrics(ctx, s.pluginMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if m := plugin.missing(pluginMetricNames); len(m) > 0 {
		t.Errorf("the kubelet plugin's /metrics lacks %v", m)
	}
	if v, ok := plugin.value("gpulink_kubeletplugin_prepared_claims"); !ok || v < 1 {
		t.Errorf("gpulink_kubeletplugin_prepared_claims = %v (found %v), want >= 1 while pod %s runs", v, ok, h.pod.Name)
	}
	t.Logf("controller exposes %d metric families, the plugin %d", len(ctrl.families), len(plugin.families))
}

// checkExplain runs `gpulink explain` (the binary of `make build`) on the
// pod and checks that it names the pod's GPUs, node and decision.
func (s *suite) checkExplain(ctx context.Context, t *testing.T, h holding) {
	binDir, err := localcluster.DefaultBinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "gpulink")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make build` first", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "explain", "--kubeconfig="+s.cluster.Kubeconfig(), "-n", h.pod.Namespace, h.pod.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("gpulink explain %s: %v\n%s", h.pod.Name, err, out)
	}
	text := string(out)
	wants := []string{
		fmt.Sprintf("Pod %s/%s: GPUs allocated", h.pod.Namespace, h.pod.Name),
		"allocated on node " + h.Node,
		strings.Join(h.Devices, ", "),
		"GPUsAllocated",
	}
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("gpulink explain %s lacks %q:\n%s", h.pod.Name, w, text)
		}
	}
	t.Logf("gpulink explain %s:\n%s", h.pod.Name, text)
}
