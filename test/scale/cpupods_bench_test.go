//go:build integration

package scale_test

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/test/localcluster"
)

// cpuPodsReport is TestCPUPodsSideBySide's result.
type cpuPodsReport struct {
	Nodes, Fill, Burst, Sequential int
	// Stock: kube-scheduler alone; Gpulink: gated by the chart's
	// gate.cpuPods policy, placed by the controller (--place-cpu-pods),
	// bound by kube-scheduler.
	Stock, Gpulink pathFigures
	// Ratios are gpulink over stock.
	PodsPerSecondRatio, BurstP50Ratio, SequentialP50Ratio float64
	// OnPreferred is the share of the gpulink path's burst pods bound to
	// the node the controller preferred.
	OnPreferred float64
}

// TestCPUPodsSideBySide measures what placing pods without GPU claims
// costs (gate.cpuPods, docs/cpu-pods.md) against kube-scheduler alone, in
// TestSchedulerSideBySide's shape: the same API-only 8-GPU nodes, a fill
// of half as many pods as GPUs, a burst of a quarter as many created at
// once, and pods created one at a time; every pod asks for 100 millicores
// and 128 MiB and no claim. Stock: the pods are ungated. gpulink: the
// chart's cpu-pods policy gates them and the controller lifts each gate
// with a preferred node.
//
// A measurement, not part of `make test`: `make bench-cpu-pods`.
func TestCPUPodsSideBySide(t *testing.T) {
	if os.Getenv("GPULINK_SCHED_BENCH") == "" {
		t.Skip("a benchmark: run it with make bench-cpu-pods (GPULINK_SCHED_BENCH=1)")
	}
	cfg := schedConfigFromEnv(t)
	e := setup(t)
	publishBenchNodes(t, e, cfg.Nodes, "cpu")
	cpuPod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}},
				TerminationGracePeriodSeconds: ptr.To[int64](0),
			},
		}
	}
	stages := newStageWatch(t, e)
	rep := cpuPodsReport{Nodes: cfg.Nodes, Fill: cfg.Nodes * 8 / 2, Burst: cfg.Burst, Sequential: cfg.Sequential}
	rep.Stock = runPath(t, e, stages, "cpu-stock", rep.Fill, cfg, nil, cpuPod)

	installCPUPodsPolicy(t, e, cpuPod("policy-probe"))
	ctrl := startControllerProcess(t, e, cfg.ProfileDir != "", "--place-cpu-pods")
	ctrl.waitReady(t)
	onPreferred := watchPreferred(t, e, "cpu-gpulink-burst-")
	rep.Gpulink = runPath(t, e, stages, "cpu-gpulink", rep.Fill, cfg, ctrl, cpuPod)
	ctrl.stop()
	on, burst := onPreferred()
	if burst > 0 {
		rep.OnPreferred = float64(on) / float64(burst)
	}

	rep.PodsPerSecondRatio = rep.Gpulink.BurstPodsPerSecond / rep.Stock.BurstPodsPerSecond
	rep.BurstP50Ratio = rep.Gpulink.BurstP50Ms / rep.Stock.BurstP50Ms
	rep.SequentialP50Ratio = rep.Gpulink.SequentialP50Ms / rep.Stock.SequentialP50Ms
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pods without GPU claims, side by side:\n%s", out)
	if burst == 0 {
		t.Errorf("no burst pod of the gpulink path carried a preferred node")
	}
	if cfg.Report != "" {
		if err := os.WriteFile(cfg.Report, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// installCPUPodsPolicy installs the chart's gate.cpuPods policy, its
// binding limited to the test's namespace, and waits until it gates the
// probe pod (a dry-run create).
func installCPUPodsPolicy(t *testing.T, e *env, probe *corev1.Pod) {
	t.Helper()
	// Rendered for another namespace: the policy never gates pods of the
	// release's own.
	out, err := localcluster.HelmTemplate(e.ctx, "gpulink", "gpulink-system", "--set", "gate.cpuPods.enabled=true", "--show-only", "templates/cpu-pods-gate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if policies, bindings := createPolicies(t, e, out); policies != 1 || bindings != 1 {
		t.Fatalf("rendered %d policies and %d bindings, want 1 and 1:\n%s", policies, bindings, out)
	}
	e.poll("the chart's cpu-pods gate policy in effect", time.Minute, func() bool {
		p, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && gated(p)
	})
}

// watchPreferred follows the bound pods whose names start with prefix and
// carry a preferred node term naming one node: the returned function
// tells how many of them kube-scheduler bound to that node, of how many.
func watchPreferred(t *testing.T, e *env, prefix string) func() (on, all int) {
	t.Helper()
	var mu sync.Mutex
	bound := map[string]bool{}
	factory := informers.NewSharedInformerFactoryWithOptions(e.client, 0, informers.WithNamespace(e.ns))
	inf := factory.Core().V1().Pods().Informer()
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" || !strings.HasPrefix(p.Name, prefix) || p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
			return
		}
		for _, term := range p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			for _, f := range term.Preference.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					mu.Lock()
					bound[p.Name] = f.Values[0] == p.Spec.NodeName
					mu.Unlock()
				}
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) }}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	return func() (on, all int) {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range bound {
			all++
			if v {
				on++
			}
		}
		return on, all
	}
}
