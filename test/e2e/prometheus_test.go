//go:build e2e && prometheus

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

// scrapeInterval is the ServiceMonitor's interval in this test (the chart
// leaves it to Prometheus by default): short, so that rates have samples
// within a minute.
const scrapeInterval = 5 * time.Second

// TestPrometheusDashboard checks the Grafana dashboard and the chart's
// ServiceMonitor against a real Prometheus (3.16, hack/prometheus.sh)
// (make test-prometheus). The chart is helm-installed on the real node
// with its ServiceMonitor (the Prometheus Operator's CRD installed first)
// and the scrape configuration is what the operator would make of the
// ServiceMonitor read back from the API server (scrapeconfig_test.go),
// pointed at the controller's and the plugin's metrics Services. Workloads
// make the series exist: two whole GPUs, a share, a pair below the node's
// best link (a selector leaves it two GPUs of different pairs), a fatal
// health event on a free GPU. A stand-in dcgm-exporter serves DCGM fields
// for the node's GPUs, so the per-pod joins run on real data. Then every
// query of deployments/grafana/gpulink.json, with its template variables
// expanded as Grafana would (the variables' own queries pick the values),
// must return series through Prometheus's HTTP API.
//
// The rolling-update case: a second kubelet plugin of the real node runs
// as a process beside the chart's pod (--rolling-update-uid, as a surge
// pod does) and is scraped as a second pod of the plugin's job. Both
// report the node's prepared claims and GPUs, and both count the health
// event; the dashboard's panels must show each once.
func TestPrometheusDashboard(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	const buildFirst = "first (make test-prometheus does)"
	cc := startChartCluster(ctx, t, "glprom", "cluster logs in c/logs, Prometheus's and the processes' logs in logs, its configuration in prom",
		localcluster.Options{}, map[string]string{
			"helm":                  "run `hack/helm.sh --build` " + buildFirst,
			"prometheus":            "run `hack/prometheus.sh` " + buildFirst,
			"gpulink-kubeletplugin": "run `make build` " + buildFirst,
			"nvidia-cdi-hook":       "run `make build` " + buildFirst,
		})
	t.Logf("built %s and started the cluster in %.1fs", cc.imageRef, time.Since(begin).Seconds())
	root, binDir, dir, logDir, cluster := cc.root, cc.binDir, cc.dir, cc.logDir, cc.cluster
	helm, prom, pluginBin := filepath.Join(binDir, "helm"), filepath.Join(binDir, "prometheus"), filepath.Join(binDir, "gpulink-kubeletplugin")
	version, err := exec.CommandContext(ctx, prom, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", prom, err)
	}
	t.Logf("%s", bytes.SplitN(version, []byte("\n"), 2)[0])
	if err := cluster.InstallServiceMonitorCRD(ctx); err != nil {
		t.Fatal(err)
	}
	client := cluster.Client()
	node := cluster.NodeName()
	s := &suite{cluster: cluster, client: client, realNode: node, mpsRoot: filepath.Join(dir, "mps")}
	chart := installMonitoredChart(ctx, t, s, root, dir, helm)

	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := serviceMonitorJobs(ctx, client, dyn, chartNamespace, helmRelease)
	if err != nil {
		t.Fatal(err)
	}
	plugin := -1
	for i, j := range jobs {
		for _, g := range j.targets {
			t.Logf("job %s (honor_labels %t, interval %s): %s %v", j.name, j.honorLabels, j.interval, g.Targets, g.Labels)
			if g.Labels["job"] == "kubelet-plugin" {
				plugin = i
			}
		}
	}
	if len(jobs) != 1 || len(jobs[0].targets) != 2 || plugin != 0 {
		t.Fatalf("the ServiceMonitor resolves to %d jobs (%+v), want one with the controller's and the plugin's targets", len(jobs), jobs)
	}
	// The stand-in dcgm-exporter, as its own chart's ServiceMonitor would
	// have it scraped; no target yet.
	dcgm := scrapeJob{name: "serviceMonitor/gpu-operator/nvidia-dcgm-exporter/0", path: "/metrics", interval: scrapeInterval.String(), honorLabels: true}
	jobs = append(jobs, dcgm)
	promDir := filepath.Join(dir, "prom")
	if err := os.MkdirAll(promDir, 0o755); err != nil {
		t.Fatal(err)
	}
	config, err := prometheusConfig(promDir, jobs)
	if err != nil {
		t.Fatal(err)
	}
	promAddr := fmt.Sprintf("127.0.0.1:%d", localcluster.FreePort(t))
	promProc := localcluster.StartBinary(t, logDir, "prometheus", prom,
		"--config.file="+config, "--storage.tsdb.path="+filepath.Join(promDir, "data"),
		"--web.listen-address="+promAddr)
	if err := promProc.WaitHTTP(ctx, "http://"+promAddr+"/-/ready", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pc, err := promapi.NewClient(promapi.Config{Address: "http://" + promAddr})
	if err != nil {
		t.Fatal(err)
	}
	api := promv1.NewAPI(pc)
	// Scraped before the workloads start, so that their events are
	// increases of the counters Prometheus saw, not their first values.
	waitTargetsUp(ctx, t, api, 2)
	time.Sleep(scrapeInterval)
	workloads := time.Now()

	var first, share, below holding
	var gang []holding
	ok := t.Run("workloads run through the chart's controller and plugin", func(t *testing.T) {
		first = s.twoGPUPod(ctx, t, "two-gpus")
		share = s.sharePod(ctx, t, first)
	})
	if !ok {
		return
	}
	ok = t.Run("a gang of two pods is placed and counted", func(t *testing.T) {
		gang = s.gangPair(ctx, t)
		// Both pods on the one node: the gang spans level "node", and
		// its wait is observed once. The level's series was there at 0
		// before the gang (the controller makes one per level at start),
		// so the placement is an increase, which the panel's rate()
		// shows; a series born at 1 would show 0.
		equals := func(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
		for _, c := range []struct {
			query, want string
			ok          func(float64) bool
		}{
			{`sum(gpulink_controller_gangs_placed_total{level="node"})`, "1", equals(1)},
			{`sum(gpulink_controller_gangs_placed_total)`, "1", equals(1)},
			{`sum(gpulink_controller_gang_wait_seconds_count)`, "1", equals(1)},
			{`max(gpulink_controller_gang_reserved_nodes)`, "0", equals(0)},
			{`sum(increase(gpulink_controller_gangs_placed_total{level="node"}[1m]))`, "more than 0", func(v float64) bool { return v > 0 }},
		} {
			if got, err := waitValue(ctx, t, api, c.query, 4*scrapeInterval, c.ok); err != nil {
				t.Errorf("%s = %v, want %s: %v", c.query, got, c.want, err)
			}
		}
	})
	if !ok {
		return
	}
	// The rolling update: a second plugin of the node beside the chart's
	// pod, sharing its plugin directory, registered under its own socket.
	surgeAddr := fmt.Sprintf("127.0.0.1:%d", localcluster.FreePort(t))
	surge := localcluster.StartBinary(t, logDir, "kubeletplugin-surge", pluginBin, append(chart.pluginArgs,
		"--kubeconfig="+cluster.Kubeconfig(),
		"--rolling-update-uid=00000000-0000-0000-0000-00000000e2e1",
		"--metrics-address="+surgeAddr,
		// The chart's image ships the hook; the pod installs it into
		// the plugin directory, as this process does.
		"--cdi-hook-source="+filepath.Join(binDir, "nvidia-cdi-hook"),
		"--v=2")...)
	if err := surge.WaitHTTP(ctx, "http://"+surgeAddr+"/metrics", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	chartTarget := jobs[plugin].targets[0]
	for _, g := range jobs[plugin].targets {
		if g.Labels["job"] == "kubelet-plugin" {
			chartTarget = g
		}
	}
	surgeLabels := map[string]string{}
	for k, v := range chartTarget.Labels {
		surgeLabels[k] = v
	}
	surgeLabels["pod"] = chartTarget.Labels["pod"] + "-surge"
	jobs[plugin].targets = append(jobs[plugin].targets, targetGroup{Targets: []string{surgeAddr}, Labels: surgeLabels})
	if err := jobs[plugin].writeTargets(promDir); err != nil {
		t.Fatal(err)
	}

	dashboard := filepath.Join(root, "deployments", "grafana", "gpulink.json")
	var failed string
	ok = t.Run("a pair below the node's best link, a fatal health event on a free GPU", func(t *testing.T) {
		held := map[string]bool{}
		for _, h := range append([]holding{first, share}, gang...) {
			for _, d := range h.Devices {
				held[d] = true
			}
		}
		below = s.belowBestPair(ctx, t, held)
		for _, d := range below.Devices {
			held[d] = true
		}
		for _, g := range s.nodes(ctx, t)[node].GPUs {
			if !held[g.Device] {
				failed = g.Device
			}
		}
		line := fmt.Sprintf(`{"device":%q,"kind":"xid","xid":79,"message":"injected by e2e"}`+"\n", failed)
		f, err := os.OpenFile(filepath.Join(chart.pluginDir, "health-events.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		s.waitTaints(ctx, t, []string{failed})
	})
	if !ok {
		return
	}
	// dcgm-exporter's fields for every GPU of the node.
	nodeView := s.nodes(ctx, t)[node]
	dcgmAddr := serveDCGM(t, node, nodeView)
	jobs[len(jobs)-1].targets = []targetGroup{{Targets: []string{dcgmAddr}, Labels: map[string]string{
		"job": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "service": "nvidia-dcgm-exporter",
		"pod": "nvidia-dcgm-exporter-e2e", "container": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
	}}}
	if err := jobs[len(jobs)-1].writeTargets(promDir); err != nil {
		t.Fatal(err)
	}
	waitTargetsUp(ctx, t, api, 4)

	t.Run("two plugin instances of the node are counted once", func(t *testing.T) {
		cp, err := kubeletplugin.NewCheckpointStore(chart.pluginDir).Load()
		if err != nil {
			t.Fatal(err)
		}
		gpus := map[string]bool{}
		for _, h := range append([]holding{first, share, below}, gang...) {
			for _, d := range h.Devices {
				gpus[d] = true
			}
		}
		sel := fmt.Sprintf(`{node=%q}`, node)
		// The setting: both instances scraped, both counted the event.
		for what, q := range map[string]string{
			"plugin targets of the node":             `count(gpulink_kubeletplugin_prepared_claims` + sel + `)`,
			"instances that counted the fatal event": `count(gpulink_kubeletplugin_health_events_total{verdict="fatal",node="` + node + `"})`,
		} {
			if v := queryScalar(ctx, t, api, q); v != 2 {
				t.Fatalf("%s: %s = %v, want 2", what, q, v)
			}
		}
		// The dashboard's own queries (variables expanded) show the node
		// once. The health events' panel is a rate of a counter both
		// instances count: its expression without the rate must count the
		// event once.
		panels := map[string]string{}
		queries, _ := dashboardQueries(t, dashboard)
		for _, q := range queries {
			panels[q.where] = strings.NewReplacer(`$node`, regexp.QuoteMeta(node), `$namespace`, ns).Replace(q.expr)
		}
		withoutRate := regexp.MustCompile(`rate\(([^()]*)\[\$__rate_interval\]\)`)
		for _, c := range []struct {
			panel string
			want  float64
		}{
			{`"Prepared claims"/A`, float64(len(cp.Claims))},
			{`"Unhealthy GPUs"/A`, 1},
			{`"Health events by verdict"/A`, 1},
			{`"GPUs by namespace"/A`, float64(len(gpus))},
		} {
			q, ok := panels[c.panel]
			if !ok {
				t.Errorf("the dashboard has no query %s", c.panel)
				continue
			}
			q = withoutRate.ReplaceAllString(q, "$1")
			if v := queryScalar(ctx, t, api, q); v != c.want {
				t.Errorf("%s: %s = %v, want %v", c.panel, q, v, c.want)
			} else {
				t.Logf("%s: %s = %v", c.panel, q, v)
			}
		}
		// One row per GPU and pod in the table and the per-pod panels,
		// not one per instance.
		for _, panel := range []string{`"Prepared GPUs by pod"/A`, `"GPU utilization by pod"/A`, `"GPU memory used by pod"/A`} {
			q, ok := panels[panel]
			if !ok {
				t.Errorf("the dashboard has no query %s", panel)
				continue
			}
			if n := len(query(ctx, t, api, q)); n != len(gpus) {
				t.Errorf("%s: %s: %d series, want one per GPU of the running workload pods (%d)", panel, q, n, len(gpus))
			}
		}
	})
	// The pair below the node's best link is the controller's first such
	// allocation, and its series was there at 0 since the controller saw
	// the node's slices: an increase that the panel "Requests below the
	// node's best link" shows.
	t.Run("the first pair below the node's best link is an increase", func(t *testing.T) {
		q := `sum(increase(gpulink_controller_below_best_link_total{size="2"}[5m]))`
		if got, err := waitValue(ctx, t, api, q, 2*time.Minute, func(v float64) bool { return v > 0 }); err != nil {
			t.Fatalf("%s = %v 2 minutes after the pair was allocated, want more than 0: %v", q, got, err)
		}
	})
	// Deleting a running pod's claim and then the pod releases its
	// allocation (reason orphaned: no pod uses the claim any more). The
	// reason's series is there at 0 from the controller's start, so the
	// release is an increase the "Errors and releases" panel's rate()
	// shows.
	t.Run("deleting a running pod's claim and the pod releases its allocation", func(t *testing.T) {
		if err := client.ResourceV1().ResourceClaims(ns).Delete(ctx, below.claim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := client.CoreV1().Pods(ns).Delete(ctx, below.pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		q := `sum(increase(gpulink_controller_released_allocations_total{reason="orphaned"}[5m]))`
		if got, err := waitValue(ctx, t, api, q, 2*time.Minute, func(v float64) bool { return v > 0 }); err != nil {
			t.Fatalf("%s = %v 2 minutes after the claim and its pod were deleted, want more than 0: %v", q, got, err)
		}
	})
	ok = t.Run("every query of the dashboard returns series", func(t *testing.T) {
		checkDashboardQueries(ctx, t, api, dashboard, node, workloads)
	})
	if !ok {
		t.Logf("queries failed; Prometheus keeps its data in %s", promDir)
	}
	t.Logf("Prometheus e2e took %.1fs", time.Since(begin).Seconds())
}

// monitoredChart is what installMonitoredChart set up.
type monitoredChart struct {
	pluginDir string
	// pluginArgs run a plugin process as the chart's pod runs (same
	// node, directories and GPUs), for a second instance.
	pluginArgs []string
}

// installMonitoredChart helm-installs the chart on the real node as
// TestHelmInstallOnRealNode does, with metrics ports for one controller
// and the plugin (host network: two controller replicas would need two
// ports of the node) and the ServiceMonitor, and waits until the plugin
// published the node's GPUs and the gate policy works.
func installMonitoredChart(ctx context.Context, t *testing.T, s *suite, root, dir, helm string) monitoredChart {
	t.Helper()
	cluster, client := s.cluster, s.client
	topology := filepath.Join(root, "driver", "topology", "testdata", "pcie-nvbridge-8.txt")
	driverRoot, _ := s.prepareChartNode(ctx, t, topology, dir)
	kubeletRoot := cluster.KubeletRootDir()
	webhookPort := localcluster.FreePort(t)
	// The dashboard's Pods row reads the opt-in per-pod series.
	values := s.chartValues(t, dir, driverRoot, fmt.Sprintf(`controller:
  replicas: 1
  metricsPort: %d
kubeletPlugin:
  podMetrics: true
compat:
  port: %d
  url: https://127.0.0.1:%d/translate-pods
  tls: {ipSANs: [127.0.0.1]}
serviceMonitor:
  enabled: true
  interval: %s
  scrapeTimeout: 4s
  labels: {release: prometheus}
`, localcluster.FreePort(t), webhookPort, webhookPort, scrapeInterval))
	args := append([]string{"install", helmRelease, filepath.Join(root, "deployments", "helm", "gpulink"),
		"--kubeconfig", cluster.Kubeconfig(), "--namespace", chartNamespace}, values...)
	if out, err := exec.CommandContext(ctx, helm, args...).CombinedOutput(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	waitComponentPod(ctx, t, client, "kubelet-plugin", "")
	waitComponentPod(ctx, t, client, "controller", "")
	waitSlices(ctx, t, client, s.realNode, 8)
	if err := waitGatePolicy(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	pluginDir := filepath.Join(kubeletRoot, "plugins", driver.Name)
	return monitoredChart{pluginDir: pluginDir, pluginArgs: []string{
		"--node-name=" + s.realNode,
		"--discovery=topology-file",
		"--topology-file=" + topology,
		"--gpu-product=" + chartGPUProduct,
		"--gpu-memory=" + chartGPUMemory,
		"--gpu-compute-capability=" + chartComputeCapability,
		"--kubelet-registrar-dir=" + filepath.Join(kubeletRoot, "plugins_registry"),
		"--kubelet-plugin-dir=" + pluginDir,
		"--cdi-root=" + cluster.CDIDir(),
		"--mps-root=" + s.mpsRoot,
		"--driver-root=" + driverRoot,
		"--pod-metrics=true",
	}}
}

// belowBestPair runs a pod whose claim's selector leaves it two free GPUs
// of different NVLink pairs of pcie-nvbridge-8.txt (linked by PCIe, the
// node's best pair by NVLink), so gpulink_controller_below_best_link_total
// counts one.
func (s *suite) belowBestPair(ctx context.Context, t *testing.T, held map[string]bool) holding {
	const name = "below-best"
	node := s.nodes(ctx, t)[s.realNode]
	best := node.BestWeakest(2, nil)
	var pick []gpuview.GPU
	for i, a := range node.GPUs {
		for _, b := range node.GPUs[i+1:] {
			if held[a.Device] || held[b.Device] || pick != nil {
				continue
			}
			if w, err := node.Weakest([]string{a.Device, b.Device}); err == nil && w < best {
				pick = []gpuview.GPU{a, b}
			}
		}
	}
	if pick == nil {
		t.Fatalf("no two free GPUs of %s linked below its best pair (%s); held: %v", s.realNode, best, held)
	}
	s.template(ctx, t, name, resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassWhole, Count: 2,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes[%q].%s in [%d, %d]`, driver.Name, driver.AttrIndex, pick[0].Index, pick[1].Index),
		}}},
	}, nil)
	s.pod(ctx, t, name, name, s.realNode)
	h := s.waitBound(ctx, t, name)
	weakest, err := node.Weakest(h.Devices)
	if err != nil {
		t.Fatal(err)
	}
	if weakest >= best {
		t.Fatalf("pair %s is linked by %s, the node's best pair by %s: want a weaker pair", gpuview.Indexes(h.Devices), weakest, best)
	}
	s.waitRunning(ctx, t, &h)
	return h
}

// serveDCGM serves dcgm-exporter's utilization and framebuffer fields,
// with its labels, for every GPU of the node, and returns the address.
func serveDCGM(t *testing.T, node string, view *gpuview.Node) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	labels := []string{"gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
	util := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "DCGM_FI_DEV_GPU_UTIL", Help: "GPU utilization (in %)."}, labels)
	fb := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "DCGM_FI_DEV_FB_USED", Help: "Framebuffer memory used (in MiB)."}, labels)
	reg.MustRegister(util, fb)
	for _, g := range view.GPUs {
		l := []string{fmt.Sprint(g.Index), g.UUID, fmt.Sprintf("nvidia%d", g.Minor), view.Product, node, "550.90.07"}
		util.WithLabelValues(l...).Set(float64(10 + 10*g.Index))
		fb.WithLabelValues(l...).Set(float64(1024 * (g.Index + 1)))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// waitTargetsUp waits until Prometheus scraped n targets successfully.
func waitTargetsUp(ctx context.Context, t *testing.T, api promv1.API, n int) {
	t.Helper()
	var state []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		targets, err := api.Targets(ctx)
		if err != nil {
			return false, err
		}
		state = nil
		up := 0
		for _, tg := range targets.Active {
			state = append(state, fmt.Sprintf("%s %s %s %s", tg.ScrapePool, tg.ScrapeURL, tg.Health, tg.LastError))
			if tg.Health == promv1.HealthGood {
				up++
			}
		}
		return up == n && len(targets.Active) == n, nil
	})
	if err != nil {
		t.Fatalf("want %d targets up: %v; targets:\n%s", n, err, strings.Join(state, "\n"))
	}
	t.Logf("Prometheus scrapes %d targets:\n%s", n, strings.Join(state, "\n"))
}

// query runs an instant query and returns its vector.
func query(ctx context.Context, t *testing.T, api promv1.API, q string) model.Vector {
	t.Helper()
	vec, err := queryVector(ctx, t, api, q)
	if err != nil {
		t.Fatal(err)
	}
	return vec
}

// queryVector is query returning its error.
func queryVector(ctx context.Context, t *testing.T, api promv1.API, q string) (model.Vector, error) {
	t.Helper()
	v, warnings, infos, err := api.Query(ctx, q, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	if len(warnings) > 0 || len(infos) > 0 {
		t.Logf("query %s: warnings %v, notes %v", q, warnings, infos)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: a %s, want a vector", q, v.Type())
	}
	return vec, nil
}

// queryScalar runs a query that must return one series and returns its
// value (NaN when it returns none or several, which the caller reports).
func queryScalar(ctx context.Context, t *testing.T, api promv1.API, q string) float64 {
	t.Helper()
	vec := query(ctx, t, api, q)
	if len(vec) != 1 {
		t.Errorf("%s: %d series (%v), want one", q, len(vec), vec)
		return math.NaN()
	}
	return float64(vec[0].Value)
}

// waitValue polls q, a query of one series, until its value satisfies ok or
// timeout passes; it returns the last value.
func waitValue(ctx context.Context, t *testing.T, api promv1.API, q string, timeout time.Duration, ok func(float64) bool) (float64, error) {
	t.Helper()
	got := math.NaN()
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		vec, err := queryVector(ctx, t, api, q)
		if err != nil || len(vec) != 1 {
			return false, nil
		}
		got = float64(vec[0].Value)
		return ok(got), nil
	})
	return got, err
}

// dashboardQuery is one PromQL expression of the dashboard.
type dashboardQuery struct {
	where, expr string
}

// dashboardQueries returns the expr of every target (rows' panels
// included) and the label_values() variables (name, metric, label).
func dashboardQueries(t *testing.T, path string) (queries []dashboardQuery, variables [][3]string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				queries = append(queries, dashboardQuery{where: fmt.Sprintf("%q/%s", p.Title, tg.RefID), expr: tg.Expr})
			}
		}
	}
	walk(dash.Panels)
	labelValues := regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*(\w+)\s*\)$`)
	for _, v := range dash.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			variables = append(variables, [3]string{v.Name, m[1], m[2]})
		}
	}
	return queries, variables
}

type dashPanel struct {
	Title   string      `json:"title"`
	Panels  []dashPanel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// checkDashboardQueries evaluates every query of the dashboard. The
// variables take the values Grafana offers from their label_values()
// queries: the real node, and the workloads' namespace (which also checks
// that honor_labels kept the info series' own namespace label rather than
// the plugin pod's). $__rate_interval becomes the time since the first
// workload plus four scrape intervals, what Grafana's $__rate_interval is
// (at least four scrape intervals, more with the panel's step) for a
// dashboard whose time range is the test's run, so that the rates and
// quantiles cover the workloads' events.
func checkDashboardQueries(ctx context.Context, t *testing.T, api promv1.API, path, node string, since time.Time) {
	queries, variables := dashboardQueries(t, path)
	if len(queries) < 30 || len(variables) != 2 {
		t.Fatalf("%s: %d queries and %d label_values variables, want at least 30 and 2", path, len(queries), len(variables))
	}
	want := map[string]string{"node": node, "namespace": ns}
	values := map[string]string{}
	for _, v := range variables {
		name, metric, label := v[0], v[1], v[2]
		var got model.LabelValues
		err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			var err error
			got, _, _, err = api.LabelValues(ctx, label, []string{metric}, time.Now().Add(-time.Hour), time.Now())
			return len(got) > 0, err
		})
		if err != nil {
			t.Fatalf("variable $%s: label_values(%s, %s): %v", name, metric, label, err)
		}
		w, ok := want[name]
		if !ok {
			t.Fatalf("variable $%s: the test does not know what to select", name)
		}
		if len(got) != 1 || string(got[0]) != w {
			t.Errorf("variable $%s: label_values(%s, %s) = %v, want [%s]", name, metric, label, got, w)
		}
		values["$"+name] = regexp.QuoteMeta(w)
	}
	window := (time.Since(since) + 4*scrapeInterval).Round(time.Second)
	values["$__rate_interval"] = fmt.Sprintf("%ds", int(window.Seconds()))
	var names []string
	for k := range values {
		names = append(names, k)
	}
	// The longest name first: $__rate_interval before a shorter prefix.
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	var pairs []string
	for _, k := range names {
		pairs = append(pairs, k, values[k])
	}
	expand := strings.NewReplacer(pairs...)
	for _, q := range queries {
		expr := expand.Replace(q.expr)
		if strings.Contains(expr, "$") {
			t.Errorf("%s: %q keeps a variable after expansion", q.where, expr)
			continue
		}
		var vec model.Vector
		var last error
		// A series that an event creates needs a scrape or two after it.
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*scrapeInterval, true, func(ctx context.Context) (bool, error) {
			vec, last = queryVector(ctx, t, api, expr)
			return last == nil && len(vec) > 0 && finite(vec), nil
		})
		if err != nil {
			t.Errorf("%s: %s returns %v (%v)", q.where, expr, vec, last)
			continue
		}
		t.Logf("%s: %s -> %s", q.where, expr, summary(vec))
	}
}

// finite tells whether a sample of vec is a number (a quantile of no
// observations is NaN).
func finite(vec model.Vector) bool {
	for _, s := range vec {
		if !math.IsNaN(float64(s.Value)) {
			return true
		}
	}
	return false
}

func summary(vec model.Vector) string {
	var parts []string
	for i, s := range vec {
		if i == 4 {
			parts = append(parts, fmt.Sprintf("... %d series", len(vec)))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %g", s.Metric, float64(s.Value)))
	}
	return strings.Join(parts, "; ")
}

// gangPair runs a gang of two pods of one whole GPU each on the real node,
// named by gpulink's gang labels (the chart's cluster serves the Workload
// API too; the labels make a gang either way), so that the gang panels'
// series exist.
func (s *suite) gangPair(ctx context.Context, t *testing.T) []holding {
	t.Helper()
	const template = "gang-rank"
	s.template(ctx, t, template, resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 1}, nil)
	labels := map[string]string{gangs.LabelGang: "metrics", gangs.LabelSize: "2"}
	names := []string{"gang-rank-0", "gang-rank-1"}
	for _, name := range names {
		if p := s.createLabelledPod(ctx, t, ns, name, template, s.realNode, labels); gated(p) != 1 {
			t.Fatalf("pod %s was created with gates %v; want the admission policy to add %s once", name, p.Spec.SchedulingGates, driver.SchedulingGate)
		}
	}
	var hs []holding
	for _, name := range names {
		h := s.waitBound(ctx, t, name)
		if len(h.Devices) != 1 || len(h.Shares) != 0 {
			t.Fatalf("pod %s holds %v (shares %d), want one whole GPU", name, h.Devices, len(h.Shares))
		}
		if !s.podEvent(ctx, t, ns, name, report.ReasonGangPlaced) {
			t.Errorf("pod %s has no %s event: not placed as a gang", name, report.ReasonGangPlaced)
		}
		s.waitRunning(ctx, t, &h)
		hs = append(hs, h)
	}
	if hs[0].Devices[0] == hs[1].Devices[0] {
		t.Fatalf("both pods of the gang hold %s", hs[0].Devices[0])
	}
	return hs
}
