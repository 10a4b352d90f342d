//go:build integration

package scale_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/localcluster"
)

// schedConfig sizes TestSchedulerSideBySide: the shape of scheduler_perf's
// DRA steady-state workloads (claims from a template, the cluster half full
// before the measurement), scaled by the environment.
type schedConfig struct {
	Nodes      int // GPULINK_SCHED_NODES: API-only nodes with 8 GPUs each
	Burst      int // GPULINK_SCHED_BURST: pods created at once (default a quarter of the GPUs)
	Sequential int // GPULINK_SCHED_SEQUENTIAL: pods created one at a time
	Report     string
	// ProfileDir (GPULINK_SCHED_PROFILE_DIR, absolute): CPU profiles of
	// the API server, kube-scheduler and the controller during each
	// path's burst, ProfileSeconds (GPULINK_SCHED_PROFILE_SECONDS, 10)
	// from its start, as <path>-<component>.pprof.
	ProfileDir     string
	ProfileSeconds int
}

func schedConfigFromEnv(t *testing.T) schedConfig {
	t.Helper()
	c := schedConfig{Nodes: 100, Sequential: 40, Report: os.Getenv("GPULINK_SCHED_REPORT"),
		ProfileDir: os.Getenv("GPULINK_SCHED_PROFILE_DIR"), ProfileSeconds: 10}
	for env, p := range map[string]*int{"GPULINK_SCHED_NODES": &c.Nodes, "GPULINK_SCHED_BURST": &c.Burst, "GPULINK_SCHED_SEQUENTIAL": &c.Sequential,
		"GPULINK_SCHED_PROFILE_SECONDS": &c.ProfileSeconds} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive integer", env, v)
			}
			*p = n
		}
	}
	if c.Burst == 0 {
		c.Burst = c.Nodes * 8 / 4
	}
	if c.ProfileDir != "" && !filepath.IsAbs(c.ProfileDir) {
		t.Fatalf("GPULINK_SCHED_PROFILE_DIR=%q: want an absolute path (go test runs in the package's directory)", c.ProfileDir)
	}
	if c.Burst > c.Nodes*8/2 {
		t.Fatalf("GPULINK_SCHED_BURST=%d does not fit the half of %d GPUs left free", c.Burst, c.Nodes*8)
	}
	return c
}

// pathFigures is what one path measures.
type pathFigures struct {
	// BurstPodsPerSecond: pods created at once, from the first create to
	// the last pod bound.
	BurstPodsPerSecond float64
	// Create→bound of the burst's pods and of pods created one at a time.
	BurstP50Ms, BurstP99Ms           float64
	SequentialP50Ms, SequentialP99Ms float64
	// SchedulerAttempts are kube-scheduler's scheduling attempts during
	// the burst, by result.
	SchedulerAttempts map[string]float64
	// SequentialStagesP50Ms splits create→bound of the pods created one at
	// a time: p50 from creation to each stage (stageWatch).
	SequentialStagesP50Ms map[string]float64
	// BurstCPUMsPerPod is the CPU time each process spent during the
	// burst, from the first create until the benchmark saw the last pod
	// bound, per pod.
	BurstCPUMsPerPod map[string]float64
	// BurstCPUCores is the same as the share of a core used: 2 is both
	// cores of the CI machine.
	BurstCPUCores float64
	// BurstAPIWritesPerPod are the API server's write requests during the
	// burst per pod, by verb and resource.
	BurstAPIWritesPerPod map[string]float64
}

type schedReport struct {
	Nodes, GPUs, Fill, Burst, Sequential int
	Stock, Gpulink                       pathFigures
	// Ratios are gpulink over stock: pods/s (goal ≥ 1) and create→bound
	// p50 (goal ≤ 0.5).
	PodsPerSecondRatio, BurstP50Ratio, SequentialP50Ratio float64
}

// TestSchedulerSideBySide runs the same workload twice on one cluster:
// kube-scheduler allocating untainted devices of a plain DeviceClass itself
// (the stock path: ungated pods), and gpulink (gated pods, the controller
// allocates, kube-scheduler binds). Each path fills half the GPUs first,
// then measures a burst of pods created at once and pods created one at a
// time, one GPU each from a claim template. The nodes are API-only: pods
// are bound, never run. kube-scheduler, kube-controller-manager and the
// controller all get 500+ queries per second (main_test.go), so neither
// path is held to a client rate limit the other does not meet.
//
// It is a measurement, not part of `make test`: `make bench-scheduler`.
func TestSchedulerSideBySide(t *testing.T) {
	if os.Getenv("GPULINK_SCHED_BENCH") == "" {
		t.Skip("a benchmark: run it with make bench-scheduler (GPULINK_SCHED_BENCH=1)")
	}
	cfg := schedConfigFromEnv(t)
	e := setup(t)
	nodes, topo := publishBenchNodes(t, e, cfg.Nodes, "sched")

	// The stock path's class: the driver's devices, nothing else.
	plain := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-plain"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + driver.Name + `"`}}}}}
	if _, err := e.client.ResourceV1().DeviceClasses().Create(e.ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.ResourceV1().DeviceClasses().Delete(e.ctx, plain.Name, metav1.DeleteOptions{}) })
	stockReq := controllertest.WholeRequest("gpus", 1)
	stockReq.Exactly.DeviceClassName = plain.Name
	e.template("stock", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{stockReq}})
	e.template("gpulink", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}})

	stages := newStageWatch(t, e)
	rep := schedReport{Nodes: cfg.Nodes, GPUs: cfg.Nodes * 8, Fill: cfg.Nodes * 8 / 2, Burst: cfg.Burst, Sequential: cfg.Sequential}

	// Stock first, on untainted devices and without the controller.
	republish(t, e, nodes, topo, false)
	rep.Stock = runPath(t, e, stages, "stock", rep.Fill, cfg, nil, nil)
	republish(t, e, nodes, topo, true)
	// As the chart deploys gpulink: its admission policies gate the pods
	// and put the controller's finalizer on their claims at creation.
	installChartPolicies(t, e)
	ctrl := startControllerProcess(t, e, cfg.ProfileDir != "")
	ctrl.waitReady(t)
	rep.Gpulink = runPath(t, e, stages, "gpulink", rep.Fill, cfg, ctrl, nil)
	ctrl.stop()

	rep.PodsPerSecondRatio = rep.Gpulink.BurstPodsPerSecond / rep.Stock.BurstPodsPerSecond
	rep.BurstP50Ratio = rep.Gpulink.BurstP50Ms / rep.Stock.BurstP50Ms
	rep.SequentialP50Ratio = rep.Gpulink.SequentialP50Ms / rep.Stock.SequentialP50Ms
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scheduler side by side:\n%s", out)
	if cfg.Report != "" {
		if err := os.WriteFile(cfg.Report, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// republish republishes the nodes' slices as the kubelet plugin does
// (managed), or as plain devices for the stock path: no managed taint, so
// kube-scheduler allocates them itself, and not allocatable more than
// once, so that one claim gets one whole device as with gpulink.
func republish(t *testing.T, e *env, nodes []string, topo *topology.Topology, managed bool) {
	t.Helper()
	parallel(t, 32, len(nodes), func(i int) error {
		name := nodes[i] + "-gpu.gpulink.dev"
		cur, err := e.client.ResourceV1().ResourceSlices().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading slice %s: %w", name, err)
		}
		want, err := controllertest.Slice(nodes[i], topo, controllertest.SliceOptions{Generation: cur.Spec.Pool.Generation + 1})
		if err != nil {
			return err
		}
		if !managed {
			for d := range want.Spec.Devices {
				want.Spec.Devices[d].Taints = nil
				want.Spec.Devices[d].AllowMultipleAllocations = nil
				want.Spec.Devices[d].Capacity = nil
			}
		}
		cur.Spec = want.Spec
		if _, err := e.client.ResourceV1().ResourceSlices().Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating slice %s: %w", name, err)
		}
		return nil
	})
	// Let kube-scheduler's and the controller's informers see them.
	time.Sleep(3 * time.Second)
}

// runPath fills half the GPUs, then measures a burst and pods created
// one at a time, and deletes everything it created. podFor makes the
// pods (nil: one GPU from the claim template named path).
func runPath(t *testing.T, e *env, stages *stageWatch, path string, fill int, cfg schedConfig, ctrl *controllerProcess, podFor func(name string) *corev1.Pod) pathFigures {
	t.Helper()
	newPod := func(name string) *corev1.Pod {
		if podFor != nil {
			return podFor(name)
		}
		p := e.newPod(name, path)
		// gpulink's gate comes from the chart's admission policy.
		p.Spec.SchedulingGates = nil
		return p
	}
	create := func(names []string, created map[string]time.Time, mu *sync.Mutex) {
		parallel(t, 64, len(names), func(i int) error {
			p := newPod(names[i])
			now := time.Now()
			if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating pod %s: %w", names[i], err)
			}
			if created != nil {
				mu.Lock()
				created[names[i]] = now
				mu.Unlock()
			}
			return nil
		})
	}
	names := func(kind string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s-%s-%05d", path, kind, i)
		}
		return out
	}
	waitBound := func(what string, pods []string) {
		e.poll(fmt.Sprintf("%s: %s bound", path, what), time.Duration(120+len(pods)/5)*time.Second, func() bool { return stages.countBound(pods) == len(pods) })
	}
	var fig pathFigures

	fillPods := names("fill", fill)
	create(fillPods, nil, nil)
	waitBound(fmt.Sprintf("%d fill pods", fill), fillPods)

	burstPods := names("burst", cfg.Burst)
	created := map[string]time.Time{}
	var mu sync.Mutex
	sched0, cpu0, writes0 := schedulerAttempts(t), processCPU(t), apiWrites(t, e)
	profiled := profileBurst(t, cfg, path, ctrl)
	start := time.Now()
	create(burstPods, created, &mu)
	waitBound(fmt.Sprintf("a burst of %d pods", cfg.Burst), burstPods)
	cpu1, writes1, end := processCPU(t), apiWrites(t, e), time.Now()
	profiled()
	var last time.Time
	var lat []time.Duration
	for _, n := range burstPods {
		at, _ := stages.boundAt(n)
		if at.After(last) {
			last = at
		}
		lat = append(lat, at.Sub(created[n]))
	}
	fig.BurstPodsPerSecond = float64(cfg.Burst) / last.Sub(start).Seconds()
	fig.BurstP50Ms, fig.BurstP99Ms = percentileMs(lat, 0.50), percentileMs(lat, 0.99)
	fig.SchedulerAttempts = map[string]float64{}
	for k, v := range schedulerAttempts(t) {
		if d := v - sched0[k]; d > 0 {
			fig.SchedulerAttempts[k] = d
		}
	}
	// Measured from the first create until the benchmark's poll saw the
	// last pod bound: per pod, and as cores in use over that time.
	fig.BurstCPUMsPerPod = perPod(cpu0, cpu1, cfg.Burst, 0.0001)
	for k, v := range fig.BurstCPUMsPerPod {
		fig.BurstCPUMsPerPod[k] = v * 1000
		fig.BurstCPUCores += v * float64(cfg.Burst) / end.Sub(start).Seconds()
	}
	fig.BurstAPIWritesPerPod = perPod(writes0, writes1, cfg.Burst, 0.05)
	deletePods(t, e, burstPods)
	waitClaimsGone(t, e, path+"-burst-")

	var seq []time.Duration
	seqCreated := map[string]time.Time{}
	for _, n := range names("seq", cfg.Sequential) {
		begin := time.Now()
		seqCreated[n] = begin
		create([]string{n}, nil, nil)
		waitBound("pod "+n, []string{n})
		at, _ := stages.boundAt(n)
		seq = append(seq, at.Sub(begin))
		deletePods(t, e, []string{n})
	}
	fig.SequentialP50Ms, fig.SequentialP99Ms = percentileMs(seq, 0.50), percentileMs(seq, 0.99)
	fig.SequentialStagesP50Ms = stages.breakdown(seqCreated)

	deletePods(t, e, fillPods)
	waitClaimsGone(t, e, path+"-")
	t.Logf("%s: burst of %d: %.1f pods/s, create→bound p50 %.0f ms p99 %.0f ms; one at a time: p50 %.0f ms p99 %.0f ms (stages p50 %v); kube-scheduler attempts %v; CPU %.2f cores, ms per pod %v; API writes per pod %v",
		path, cfg.Burst, fig.BurstPodsPerSecond, fig.BurstP50Ms, fig.BurstP99Ms, fig.SequentialP50Ms, fig.SequentialP99Ms, fig.SequentialStagesP50Ms,
		fig.SchedulerAttempts, fig.BurstCPUCores, fig.BurstCPUMsPerPod, fig.BurstAPIWritesPerPod)
	return fig
}

// waitClaimsGone waits until the claims of pods whose names start with
// prefix are deleted (their devices free again).
func waitClaimsGone(t *testing.T, e *env, prefix string) {
	t.Helper()
	e.poll("claims of "+prefix+"* deleted", 5*time.Minute, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, c := range l.Items {
			if strings.HasPrefix(c.Name, prefix) {
				return false
			}
		}
		return true
	})
}

// schedulerAttempts reads scheduler_schedule_attempts_total by result.
func schedulerAttempts(t *testing.T) map[string]float64 {
	t.Helper()
	text, err := cluster.SchedulerMetrics(t.Context())
	if err != nil {
		t.Logf("no kube-scheduler metrics: %v", err)
		return nil
	}
	out := map[string]float64{}
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, "scheduler_schedule_attempts_total{")
		if !ok {
			continue
		}
		_, res, _ := strings.Cut(rest, `result="`)
		res, _, _ = strings.Cut(res, `"`)
		if v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
			out[res] += v
		}
	}
	return out
}

// installChartPolicies installs the chart's scheduling-gate and
// claim-finalizer MutatingAdmissionPolicies, rendered with the project's
// helm, their bindings limited to the test's namespace, and waits until
// both take effect (dry-run creates of a pod and a claim).
func installChartPolicies(t *testing.T, e *env) {
	t.Helper()
	out, err := localcluster.HelmTemplate(e.ctx, "gpulink", e.ns, "--show-only", "templates/scheduling-gate.yaml", "--show-only", "templates/claim-finalizer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if policies, bindings := createPolicies(t, e, out); policies != 2 || bindings != 2 {
		t.Fatalf("rendered %d policies and %d bindings, want 2 and 2:\n%s", policies, bindings, out)
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	probePod := e.newPod("policy-probe", "gpulink")
	probePod.Spec.SchedulingGates = nil
	probeClaim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Namespace: e.ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}}}}
	e.poll("the chart's gate and finalizer policies in effect", time.Minute, func() bool {
		p, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, probePod, dryRun)
		if err != nil || !gated(p) {
			return false
		}
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, probeClaim, dryRun)
		return err == nil && slices.Contains(c.Finalizers, driver.ClaimFinalizer)
	})
}

// createPolicies creates the MutatingAdmissionPolicies and bindings of a
// rendering, the bindings limited to the test's namespace, deleted when
// the test ends.
func createPolicies(t *testing.T, e *env, out []byte) (policies, bindings int) {
	t.Helper()
	objs, err := localcluster.DecodeObjects(out)
	if err != nil {
		t.Fatal(err)
	}
	adm := e.client.AdmissionregistrationV1()
	for _, o := range objs {
		raw, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		switch o.GetKind() {
		case "MutatingAdmissionPolicy":
			p := &admissionv1.MutatingAdmissionPolicy{}
			if err := json.Unmarshal(raw, p); err != nil {
				t.Fatal(err)
			}
			if _, err := adm.MutatingAdmissionPolicies().Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = adm.MutatingAdmissionPolicies().Delete(context.Background(), p.Name, metav1.DeleteOptions{})
			})
			policies++
		case "MutatingAdmissionPolicyBinding":
			b := &admissionv1.MutatingAdmissionPolicyBinding{}
			if err := json.Unmarshal(raw, b); err != nil {
				t.Fatal(err)
			}
			b.Spec.MatchResources = &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns}}}
			if _, err := adm.MutatingAdmissionPolicyBindings().Create(e.ctx, b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = adm.MutatingAdmissionPolicyBindings().Delete(context.Background(), b.Name, metav1.DeleteOptions{})
			})
			bindings++
		default:
			t.Fatalf("the chart's policy templates rendered a %s", o.GetKind())
		}
	}
	return policies, bindings
}

// profileBurst starts CPU profiles of the API server, kube-scheduler and
// the controller (when it runs) for cfg.ProfileSeconds into cfg.ProfileDir
// and returns a function that waits for them; without a directory it
// does nothing.
func profileBurst(t *testing.T, cfg schedConfig, path string, ctrl *controllerProcess) (wait func()) {
	t.Helper()
	if cfg.ProfileDir == "" {
		return func() {}
	}
	if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := time.Duration(cfg.ProfileSeconds) * time.Second
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, component := range []string{"kube-apiserver", "kube-scheduler"} {
		wg.Go(func() {
			body, err := cluster.CPUProfile(t.Context(), component, d)
			if err == nil {
				err = os.WriteFile(filepath.Join(cfg.ProfileDir, path+"-"+component+".pprof"), body, 0o644)
			}
			errs <- err
		})
	}
	if ctrl != nil {
		wg.Go(func() {
			errs <- ctrl.profile(fmt.Sprintf("profile?seconds=%d", cfg.ProfileSeconds), filepath.Join(cfg.ProfileDir, path+"-gpulink-controller.pprof"), d)
		})
	}
	return func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("profiling the %s burst: %v", path, err)
			}
		}
		t.Logf("%s: CPU profiles of the burst's first %s in %s", path, d, cfg.ProfileDir)
	}
}

// publishBenchNodes publishes n API-only 8-GPU nodes (V100 SXM2, the
// scheduler benchmarks' node) named <namespace>-<infix>NNNN, removed with
// their slices when the test ends, and returns their names and topology.
func publishBenchNodes(t *testing.T, e *env, n int, infix string) ([]string, *topology.Topology) {
	t.Helper()
	topo, err := topology.ParseFile("../../driver/topology/testdata/v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-%s%04d", e.ns, infix, i)
	}
	parallel(t, 32, n, func(i int) error { return publishNode(e.ctx, e.client, nodes[i], topo) })
	t.Cleanup(func() {
		parallel(t, 32, n, func(i int) error {
			_ = e.client.ResourceV1().ResourceSlices().Delete(e.ctx, nodes[i]+"-gpu.gpulink.dev", metav1.DeleteOptions{})
			_ = e.client.CoreV1().Nodes().Delete(e.ctx, nodes[i], metav1.DeleteOptions{})
			return nil
		})
	})
	return nodes, topo
}
