//go:build integration

package scale_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/localcluster"
)

// scaleConfig sizes TestScale. The defaults are a quick run that is part
// of `make test`; `make scale` sets the full size through the environment.
type scaleConfig struct {
	Nodes int // GPULINK_SCALE_NODES: API-only nodes with 8 GPUs each
	Pods  int // GPULINK_SCALE_PODS: pods created (and deleted) in all
	Waves int // GPULINK_SCALE_WAVES: pods are created in this many waves
	// Report (GPULINK_SCALE_REPORT) is a file the figures are written to
	// as JSON, besides the test log.
	Report string
	// Profile (GPULINK_SCALE_PROFILE) is a file for a CPU profile of the
	// controller: it then runs with --profiling, and a profile of
	// ProfileSeconds (GPULINK_SCALE_PROFILE_SECONDS, default 20) is taken
	// from /debug/pprof/profile on its metrics address from the start of
	// the first wave (a run whose waves end sooner waits for it). A heap
	// profile taken at the end of the waves goes next to it, as
	// <Profile>.heap. Read them with `go tool pprof <file>` (the
	// controller binary is not kept; the profiles carry its symbols).
	Profile        string
	ProfileSeconds int
}

func scaleConfigFromEnv(t *testing.T) scaleConfig {
	t.Helper()
	c := scaleConfig{Nodes: 200, Pods: 400, Waves: 4, Report: os.Getenv("GPULINK_SCALE_REPORT"),
		Profile: os.Getenv("GPULINK_SCALE_PROFILE"), ProfileSeconds: 20}
	for env, p := range map[string]*int{"GPULINK_SCALE_NODES": &c.Nodes, "GPULINK_SCALE_PODS": &c.Pods, "GPULINK_SCALE_WAVES": &c.Waves,
		"GPULINK_SCALE_PROFILE_SECONDS": &c.ProfileSeconds} {
		v := os.Getenv(env)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", env, v)
		}
		*p = n
	}
	if c.Waves > c.Pods {
		t.Fatalf("GPULINK_SCALE_WAVES=%d exceeds GPULINK_SCALE_PODS=%d", c.Waves, c.Pods)
	}
	return c
}

// scaleReport is what TestScale measures.
type scaleReport struct {
	Nodes, GPUs, Pods, Waves int
	Topologies               []string
	// ChartPolicies: the chart's claim-finalizer and scheduling-gate
	// admission policies were installed (the chart's default).
	ChartPolicies bool
	// RankByStranding, SteerCPUPods and SteerScarceNodes: the
	// controller's flags (GPULINK_SCALE_STRANDING, GPULINK_SCALE_STEER,
	// GPULINK_SCALE_STEER_SCARCE).
	RankByStranding  bool
	SteerCPUPods     string
	SteerScarceNodes bool
	PublishSeconds   float64
	// Pod create (client side, before the call) to the gate's removal
	// (seen by a watch).
	UngatedP50Ms, UngatedP99Ms float64
	// Claims allocated per second over the waves (first create to last
	// ungated of each wave, summed).
	ClaimsPerSecond float64
	// DecisionP50Ms/P99Ms are read from the controller's
	// gpulink_controller_decision_duration_seconds histogram (planning and
	// writing one pod's claims), interpolated within buckets.
	DecisionP50Ms, DecisionP99Ms float64
	// PlanP50Ms/P99Ms are the choice alone, under the decision lock
	// (gpulink_controller_plan_duration_seconds): no lock wait, no writes.
	PlanP50Ms, PlanP99Ms float64
	ControllerRSSMiB     float64 // at the end of the pod phase
	ControllerPeakRSSMiB float64 // VmHWM
	ControllerCPUSeconds float64 // user + system, whole run
	// WaveCPUMsPerClaim is the controller's CPU over the waves (first
	// create to the last wave ungated) per claim: what a loaded machine
	// blurs least.
	WaveCPUMsPerClaim float64
	// NodeScoresPerClaim and RankingSyncs are the controller's ranking
	// work over the waves (gpulink_controller_node_scores_total,
	// gpulink_controller_ranking_syncs_total by kind).
	NodeScoresPerClaim float64
	RankingSyncs       map[string]float64
	// HeapPerNodeKiB is the controller's heap in use after the nodes were
	// published minus before, per node (includes garbage not yet
	// collected: an upper bound of the informers' memory per node).
	HeapPerNodeKiB float64
	// APIRequestsPerSecond is the controller's request rate to the API
	// server during the pod phase, from rest_client_requests_total.
	APIRequestsPerSecond float64
	APIRequestsByMethod  map[string]float64
	APIRequestsPerClaim  float64
	PodPhaseSeconds      float64
}

// scaleTopologies are the node kinds, mixed round robin: every 8-GPU
// fixture, the demo's and the go-nvml mock DGX machines.
func scaleTopologies(t *testing.T) ([]string, []*topology.Topology) {
	t.Helper()
	var names []string
	var topos []*topology.Topology
	for _, dir := range []string{"../../driver/topology/testdata", "../../demo/topologies"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			topo, err := topology.ParseFile(f)
			if err != nil {
				t.Fatalf("fixture %s: %v", f, err)
			}
			// demo/topologies repeats some fixtures: one node kind each.
			if topo.Len() == 8 && !slices.Contains(names, filepath.Base(f)) {
				names = append(names, filepath.Base(f))
				topos = append(topos, topo)
			}
		}
	}
	for _, m := range discovery.MockServers() {
		d, err := discovery.NewMock(m)
		if err != nil {
			t.Fatal(err)
		}
		topo, err := d.Discover(context.Background())
		if err != nil {
			t.Fatalf("mock %s: %v", m, err)
		}
		if topo.Len() == 8 {
			names = append(names, "mock-"+m)
			topos = append(topos, topo)
		}
	}
	return names, topos
}

// scaleRequest is one kind of pod in the mix: templates are named after it.
type scaleRequest struct {
	name   string
	weight int
	spec   resourceapi.DeviceClaim
}

func scaleRequests() []scaleRequest {
	whole := func(n int64) resourceapi.DeviceClaim {
		return resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", n)}}
	}
	twoShares := controllertest.ShareRequest("s", "4Gi", "25")
	twoShares.Exactly.Count = 2
	return []scaleRequest{
		{"gpu-1", 28, whole(1)},
		{"gpu-2", 20, whole(2)},
		{"gpu-4", 12, whole(4)},
		{"gpu-8", 3, whole(8)},
		{"nvlink-2", 5, resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)},
			Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
		}},
		{"share-small", 15, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "25")}}},
		{"share-large", 10, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "12Gi", "50")}}},
		// Several placements: a pair and a share in one claim, shares of
		// two GPUs (the controller's branch and bound).
		{"pair-and-share", 4, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			controllertest.WholeRequest("gpus", 2), controllertest.ShareRequest("s", "4Gi", "25")}}},
		{"share-x2", 3, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{twoShares}}},
	}
}

// TestScale publishes GPU nodes and runs waves of gated pods of mixed
// sizes through gpulink's controller, run as its own process, then
// deletes them, and reports latency, throughput, the controller's
// resources and API load, and the invariants. Sizes: scaleConfig.
func TestScale(t *testing.T) {
	cfg := scaleConfigFromEnv(t)
	names, topos := scaleTopologies(t)
	t.Logf("scale: %d nodes x 8 GPUs (%d kinds: %s), %d pods in %d waves", cfg.Nodes, len(topos), strings.Join(names, ", "), cfg.Pods, cfg.Waves)
	e := setup(t)
	prefix := e.ns + "-n"
	client := e.client
	// The chart installs its claim-finalizer and scheduling-gate policies
	// by default; with them an allocation is one claim status write and
	// one pod patch, without them the controller adds the finalizer
	// first (GPULINK_SCALE_POLICIES=off measures that).
	rep := scaleReport{Nodes: cfg.Nodes, GPUs: cfg.Nodes * 8, Pods: cfg.Pods, Waves: cfg.Waves, Topologies: names,
		ChartPolicies: os.Getenv("GPULINK_SCALE_POLICIES") != "off", RankByStranding: rankByStranding(), SteerCPUPods: steerCPUPodsMode(),
		SteerScarceNodes: steerScarceNodes()}
	if rep.ChartPolicies {
		installChartPolicies(t, e)
	}

	// The controller starts on an empty cluster (for its heap before the
	// nodes) and must not count other tests' nodes: the package's tests
	// run one after another and clean up, so there are none.
	ctrl := startControllerProcess(t, e, cfg.Profile != "")
	defer ctrl.stop()
	ctrl.waitReady(t)
	time.Sleep(2 * time.Second)
	heapBefore := ctrl.metric(t, "go_memstats_heap_inuse_bytes")

	// Publish: nodes and their slices, built by the kubelet plugin's own
	// sliceformat.Encode (controllertest.Slice), from this one process.
	start := time.Now()
	nodeNames := make([]string, cfg.Nodes)
	for i := range nodeNames {
		nodeNames[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	parallel(t, 32, cfg.Nodes, func(i int) error {
		return publishNode(e.ctx, client, nodeNames[i], topos[i%len(topos)])
	})
	t.Cleanup(func() {
		parallel(t, 32, cfg.Nodes, func(i int) error {
			_ = client.ResourceV1().ResourceSlices().Delete(context.Background(), nodeNames[i]+"-gpu.gpulink.dev", metav1.DeleteOptions{})
			_ = client.CoreV1().Nodes().Delete(context.Background(), nodeNames[i], metav1.DeleteOptions{})
			return nil
		})
	})
	rep.PublishSeconds = time.Since(start).Seconds()
	t.Logf("published %d nodes in %.1fs", cfg.Nodes, rep.PublishSeconds)
	// Let the controller's informers take the slices in and settle.
	time.Sleep(time.Duration(5+cfg.Nodes/500) * time.Second)
	heapAfter := ctrl.metric(t, "go_memstats_heap_inuse_bytes")
	rep.HeapPerNodeKiB = (heapAfter - heapBefore) / float64(cfg.Nodes) / 1024

	reqs := scaleRequests()
	for _, r := range reqs {
		e.template(r.name, r.spec)
	}
	var order []string // the mix as a repeating sequence, deterministic
	for _, r := range reqs {
		for range r.weight {
			order = append(order, r.name)
		}
	}

	// Watch the pods: the time a pod is seen without its gate.
	created := sync.Map{} // pod name -> time.Time before Create
	var latMu sync.Mutex
	var latencies []time.Duration
	var ungatedCount atomic.Int64
	seen := sync.Map{}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(e.ns))
	podInf := factory.Core().V1().Pods().Informer()
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || gated(p) {
			return
		}
		if _, dup := seen.LoadOrStore(p.Name, true); dup {
			return
		}
		now := time.Now()
		if c, ok := created.Load(p.Name); ok {
			latMu.Lock()
			latencies = append(latencies, now.Sub(c.(time.Time)))
			latMu.Unlock()
		}
		ungatedCount.Add(1)
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onPod, UpdateFunc: func(_, n any) { onPod(n) }}); err != nil {
		t.Fatal(err)
	}
	factory.Start(e.ctx.Done())
	factory.WaitForCacheSync(e.ctx.Done())

	podStart := time.Now()
	reqBefore := ctrl.requests(t)
	cpuBefore := ctrl.cpuSeconds(t)
	scoresBefore, syncsBefore := ctrl.rankingWork(t)
	// The CPU profile covers the waves: the controller deciding pods.
	var cpuProfile chan error
	if cfg.Profile != "" {
		cpuProfile = make(chan error, 1)
		go func() {
			cpuProfile <- ctrl.profile(fmt.Sprintf("profile?seconds=%d", cfg.ProfileSeconds), cfg.Profile, time.Duration(cfg.ProfileSeconds)*time.Second)
		}()
	}
	perWave := cfg.Pods / cfg.Waves
	var wavePods [][]string
	var activeSeconds float64
	var claims int
	next := 0
	for w := range cfg.Waves {
		n := perWave
		if w == cfg.Waves-1 {
			n = cfg.Pods - perWave*(cfg.Waves-1)
		}
		var podsOfWave []string
		for range n {
			podsOfWave = append(podsOfWave, fmt.Sprintf("p%06d-%s", next, order[next%len(order)]))
			next++
		}
		wavePods = append(wavePods, podsOfWave)
		target := ungatedCount.Load() + int64(n)
		waveStart := time.Now()
		parallel(t, 32, n, func(i int) error {
			name := podsOfWave[i]
			tpl := name[strings.IndexByte(name, '-')+1:]
			p := e.newPod(name, tpl)
			created.Store(name, time.Now())
			_, err := client.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
			return err
		})
		e.poll(fmt.Sprintf("wave %d: %d pods ungated", w, n), time.Duration(120+n/2)*time.Second, func() bool { return ungatedCount.Load() >= target })
		waveSeconds := time.Since(waveStart).Seconds()
		activeSeconds += waveSeconds
		claims += n
		t.Logf("wave %d: %d pods ungated in %.1fs", w, n, waveSeconds)
		if err := e.checkInvariants(); err != nil {
			t.Fatalf("after wave %d: %v", w, err)
		}
		// Delete the wave before last: up to two waves hold GPUs at once.
		if w >= 1 {
			deletePods(t, e, wavePods[w-1])
		}
	}
	rep.PodPhaseSeconds = time.Since(podStart).Seconds()
	rep.WaveCPUMsPerClaim = (ctrl.cpuSeconds(t) - cpuBefore) * 1000 / float64(cfg.Pods)
	scoresAfter, syncsAfter := ctrl.rankingWork(t)
	rep.NodeScoresPerClaim = (scoresAfter - scoresBefore) / float64(cfg.Pods)
	rep.RankingSyncs = map[string]float64{}
	for kind, v := range syncsAfter {
		rep.RankingSyncs[kind] = v - syncsBefore[kind]
	}
	reqAfter := ctrl.requests(t)
	if cpuProfile != nil {
		if err := ctrl.profile("heap", cfg.Profile+".heap", 0); err != nil {
			t.Error(err)
		}
		if rep.PodPhaseSeconds < float64(cfg.ProfileSeconds) {
			t.Logf("the waves took %.1fs, less than the %ds CPU profile: it also covers the idle controller", rep.PodPhaseSeconds, cfg.ProfileSeconds)
		}
		if err := <-cpuProfile; err != nil {
			t.Error(err)
		} else {
			t.Logf("controller profiles: CPU (%ds from the first wave) %s, heap (end of the waves) %s.heap", cfg.ProfileSeconds, cfg.Profile, cfg.Profile)
		}
	}
	rep.APIRequestsByMethod = map[string]float64{}
	var total float64
	for m, v := range reqAfter {
		d := v - reqBefore[m]
		rep.APIRequestsByMethod[m] = math.Round(d)
		total += d
	}
	rep.APIRequestsPerSecond = total / rep.PodPhaseSeconds
	rep.APIRequestsPerClaim = total / float64(claims)
	rep.ClaimsPerSecond = float64(claims) / activeSeconds
	rep.ControllerRSSMiB, rep.ControllerPeakRSSMiB = ctrl.rss(t)
	latMu.Lock()
	rep.UngatedP50Ms, rep.UngatedP99Ms = percentileMs(latencies, 0.50), percentileMs(latencies, 0.99)
	latMu.Unlock()
	rep.PlanP50Ms, rep.PlanP99Ms = ctrl.histogramMs(t, "gpulink_controller_plan_duration_seconds", 0.50), ctrl.histogramMs(t, "gpulink_controller_plan_duration_seconds", 0.99)
	rep.DecisionP50Ms, rep.DecisionP99Ms = ctrl.histogramMs(t, "gpulink_controller_decision_duration_seconds", 0.50), ctrl.histogramMs(t, "gpulink_controller_decision_duration_seconds", 0.99)

	// Delete the rest; every claim must be released and go away.
	deletePods(t, e, wavePods[len(wavePods)-1])
	e.poll("every claim released and deleted", time.Duration(120+cfg.Pods/20)*time.Second, func() bool {
		l, err := client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	if err := e.checkInvariants(); err != nil {
		t.Fatalf("after deleting every pod: %v", err)
	}
	rep.ControllerCPUSeconds = ctrl.cpuSeconds(t)

	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scale report:\n%s", out)
	if cfg.Report != "" {
		if err := os.WriteFile(cfg.Report, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(latencies) < cfg.Pods {
		t.Errorf("%d ungated pods timed, want %d", len(latencies), cfg.Pods)
	}
}

func gated(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == driver.SchedulingGate {
			return true
		}
	}
	return false
}

var sliceMu sync.Mutex

// publishNode creates an API-only node and publishes the slice the
// kubelet plugin would publish for it.
func publishNode(ctx context.Context, client kubernetes.Interface, name string, topo *topology.Topology) error {
	return publishNodeObject(ctx, client, controllertest.Node(name), topo)
}

// publishNodeObject is publishNode for a Node object of the caller's (its
// own allocatable, say).
func publishNodeObject(ctx context.Context, client kubernetes.Interface, node *corev1.Node, topo *topology.Topology) error {
	name := node.Name
	n, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	if err := localcluster.UntaintNewNode(ctx, client, n); err != nil {
		return err
	}
	// Slice fills in missing GPU memory sizes in topo, which nodes of one
	// kind share.
	sliceMu.Lock()
	s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
	sliceMu.Unlock()
	if err != nil {
		return fmt.Errorf("building slice of %s: %w", name, err)
	}
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("publishing slice of %s: %w", name, err)
	}
	return nil
}

func deletePods(t *testing.T, e *env, names []string) {
	t.Helper()
	parallel(t, 32, len(names), func(i int) error {
		err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, names[i], metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// parallel runs fn(0..n-1) on workers goroutines and fails the test on
// the first error.
func parallel(t *testing.T, workers, n int, fn func(int) error) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

func percentileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*q))].Microseconds()) / 1000
}

// controllerProcess is cmd/gpulink-controller run as its own process.
type controllerProcess struct {
	cmd     *exec.Cmd
	cancel  context.CancelFunc
	metrics int
	health  int
	log     string
}

// startControllerProcess builds and starts the controller; with profiling,
// it serves /debug/pprof/ on its metrics address (--profiling).
// rankByStranding: the controller ranks by stranded GPU
// (--rank-by-stranding) as the chart's default deploys it;
// GPULINK_SCALE_STRANDING=0 measures it without, for comparison.
func rankByStranding() bool { return os.Getenv("GPULINK_SCALE_STRANDING") != "0" }

// steerCPUPodsMode: the controller keeps the steering taint on GPU nodes
// with an idle GPU (--steer-cpu-pods=taint, the chart's default): its
// node patches are part of what the chart costs. GPULINK_SCALE_STEER=off
// measures without.
func steerCPUPodsMode() string {
	if os.Getenv("GPULINK_SCALE_STEER") == "off" {
		return "off"
	}
	return "taint"
}

// steerScarceNodes: the controller keeps the second steering taint on
// the idle nodes a scarce shape needs (--steer-scarce-nodes, the chart's
// default); GPULINK_SCALE_STEER_SCARCE=0 measures without.
func steerScarceNodes() bool { return os.Getenv("GPULINK_SCALE_STEER_SCARCE") != "0" }

func startControllerProcess(t *testing.T, e *env, profiling bool, extraArgs ...string) *controllerProcess {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpulink-controller")
	build := exec.CommandContext(e.ctx, "go", "build", "-o", bin, "../../cmd/gpulink-controller")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the controller: %v\n%s", err, out)
	}
	c := &controllerProcess{metrics: localcluster.FreePort(t), health: localcluster.FreePort(t), log: filepath.Join(t.TempDir(), "controller.log")}
	ctx, cancel := context.WithCancel(e.ctx)
	c.cancel = cancel
	args := []string{
		"--kubeconfig=" + cluster.Kubeconfig(),
		"--leader-elect=false",
		fmt.Sprintf("--metrics-address=127.0.0.1:%d", c.metrics),
		fmt.Sprintf("--health-address=127.0.0.1:%d", c.health),
		"--workers=32",
		"--kube-api-qps=1000", "--kube-api-burst=2000",
		// No kubelet binds here late, but kube-scheduler on a loaded
		// machine may: no release-and-retry in the middle of the run.
		"--unschedulable-grace=10m",
		"--v=1",
	}
	if profiling {
		args = append(args, "--profiling")
	}
	if rankByStranding() {
		args = append(args, "--rank-by-stranding")
	}
	args = append(args, "--steer-cpu-pods="+steerCPUPodsMode(), fmt.Sprintf("--steer-scarce-nodes=%v", steerScarceNodes()))
	args = append(args, extraArgs...)
	c.cmd = exec.CommandContext(ctx, bin, args...)
	f, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stdout, c.cmd.Stderr = f, f
	// Gone with the test, however it ends.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := os.ReadFile(c.log); err == nil {
				if len(out) > 20000 {
					out = out[len(out)-20000:]
				}
				t.Logf("controller log (tail):\n%s", out)
			}
		}
	})
	return c
}

func (c *controllerProcess) stop() {
	c.cancel()
	_ = c.cmd.Wait()
}

func (c *controllerProcess) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.health))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("controller not ready after a minute")
}

// profile fetches /debug/pprof/<what> from the controller (run with
// --profiling) into file; takes is how long the profile runs (0: at once).
// It does not touch t: it also runs in a goroutine of its own.
func (c *controllerProcess) profile(what, file string, takes time.Duration) error {
	client := &http.Client{Timeout: takes + time.Minute}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/%s", c.metrics, what))
	if err != nil {
		return fmt.Errorf("controller profile %s: %w", what, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("controller profile %s: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("controller profile %s: %s: %s", what, resp.Status, body)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	return os.WriteFile(file, body, 0o644)
}

// scrape returns the controller's metrics as name{labels} -> value.
func (c *controllerProcess) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metrics))
	if err != nil {
		t.Fatalf("scraping controller metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

func (c *controllerProcess) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := c.scrape(t)[name]
	if !ok {
		t.Fatalf("controller metric %s missing", name)
	}
	return v
}

// rankingWork reads the controller's node scores computed and its
// rankings' syncs by kind.
func (c *controllerProcess) rankingWork(t *testing.T) (scores float64, syncs map[string]float64) {
	t.Helper()
	syncs = map[string]float64{}
	for k, v := range c.scrape(t) {
		switch {
		case k == "gpulink_controller_node_scores_total":
			scores = v
		case strings.HasPrefix(k, "gpulink_controller_ranking_syncs_total{"):
			syncs[labelValue(k, "kind")] = v
		}
	}
	return scores, syncs
}

// requests sums rest_client_requests_total by method.
func (c *controllerProcess) requests(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range c.scrape(t) {
		if !strings.HasPrefix(k, "rest_client_requests_total{") {
			continue
		}
		m := labelValue(k, "method")
		out[m] += v
	}
	return out
}

func labelValue(series, label string) string {
	i := strings.Index(series, label+`="`)
	if i < 0 {
		return ""
	}
	rest := series[i+len(label)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

// histogramMs estimates a quantile of a histogram in milliseconds,
// interpolating linearly within the bucket it falls in.
func (c *controllerProcess) histogramMs(t *testing.T, name string, q float64) float64 {
	t.Helper()
	type bucket struct{ le, n float64 }
	var bs []bucket
	for k, v := range c.scrape(t) {
		if !strings.HasPrefix(k, name+"_bucket{") {
			continue
		}
		le := labelValue(k, "le")
		f, err := strconv.ParseFloat(le, 64)
		if le == "+Inf" {
			f, err = math.Inf(1), nil
		}
		if err != nil {
			continue
		}
		bs = append(bs, bucket{f, v})
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.le < b.le:
			return -1
		case a.le > b.le:
			return 1
		}
		return 0
	})
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].n
	lo, prev := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return lo * 1000
			}
			return (lo + (b.le-lo)*(rank-prev)/math.Max(b.n-prev, 1)) * 1000
		}
		lo, prev = b.le, b.n
	}
	return lo * 1000
}

// rss reads the controller's resident and peak resident memory (MiB).
func (c *controllerProcess) rss(t *testing.T) (cur, peak float64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			cur = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return cur, peak
}

// cpuSeconds reads the controller's user + system CPU time.
func (c *controllerProcess) cpuSeconds(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in ")".
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}
