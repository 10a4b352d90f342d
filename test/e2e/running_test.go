//go:build e2e

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/gpulink/gpulink/driver"
)

// runningFigures is what one path measures on the real node: pods created
// one at a time, and a burst of as many pods as the node has GPUs.
type runningFigures struct {
	SequentialBoundP50Ms, SequentialRunningP50Ms float64
	SequentialRunningP99Ms                       float64
	BurstRunningP50Ms, BurstRunningP99Ms         float64
	// BurstRunningPodsPerSecond: from the first create to the last pod
	// Running.
	BurstRunningPodsPerSecond float64
}

type runningReport struct {
	Node               string
	GPUs, Sequential   int
	Gpulink, Stock     runningFigures
	SequentialRatio    float64 // gpulink over stock, create→Running p50
	BurstPodsPerSecond float64 // gpulink over stock, pods/s to Running
}

// TestRunningSideBySide measures what the scheduler benchmark
// (test/scale, API-only nodes) cannot: create→Running on the real node
// (kubelet, containerd, gpulink's kubelet plugin preparing each claim and
// writing its CDI spec), one GPU per pod, for gpulink (the chart's gate
// policy, the controller allocates) and for kube-scheduler allocating the
// same devices itself (a plain class, a claim that tolerates gpulink's
// managed taint, the controller stopped). Both paths' pods are pinned to
// the real node. It is a measurement, not part of `make test`: `make
// bench-running` (GPULINK_RUNNING_BENCH=1; GPULINK_RUNNING_REPORT names a
// JSON report).
func TestRunningSideBySide(t *testing.T) {
	if os.Getenv("GPULINK_RUNNING_BENCH") == "" {
		t.Skip("a benchmark: run it with make bench-running (GPULINK_RUNNING_BENCH=1)")
	}
	ctx := t.Context()
	s := setup(ctx, t)
	const gpus, sequential = 8, 10
	rep := runningReport{Node: s.realNode, GPUs: gpus, Sequential: sequential}

	s.template(ctx, t, "run-gpulink", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}, nil)
	w := newRunningWatch(t, s)
	rep.Gpulink = s.measureRunning(t, w, ns, "run-gpulink", "gl", gpus, sequential)

	// The stock path: kube-scheduler allocates gpulink's devices itself.
	s.controller.Stop(t)
	s.controller = nil
	plain := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "run-plain"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + driver.Name + `"`}}}}}
	if _, err := s.client.ResourceV1().DeviceClasses().Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.templateIn(ctx, t, ungatedNS, "run-stock", resourceapi.ExactDeviceRequest{
		DeviceClassName: plain.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Tolerations: []resourceapi.DeviceToleration{{Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists}},
	}, nil)
	rep.Stock = s.measureRunning(t, w, ungatedNS, "run-stock", "st", gpus, sequential)

	rep.SequentialRatio = rep.Gpulink.SequentialRunningP50Ms / rep.Stock.SequentialRunningP50Ms
	rep.BurstPodsPerSecond = rep.Gpulink.BurstRunningPodsPerSecond / rep.Stock.BurstRunningPodsPerSecond
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create→Running on the real node:\n%s", out)
	if f := os.Getenv("GPULINK_RUNNING_REPORT"); f != "" {
		if err := os.WriteFile(f, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runningWatch records when each pod (namespace/name) is first seen bound
// and Running.
type runningWatch struct {
	mu             sync.Mutex
	bound, running map[string]time.Time
}

func newRunningWatch(t *testing.T, s *suite) *runningWatch {
	t.Helper()
	w := &runningWatch{bound: map[string]time.Time{}, running: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactory(s.client, 0)
	inf := factory.Core().V1().Pods().Informer()
	on := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		key := p.Namespace + "/" + p.Name
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, seen := w.bound[key]; !seen && p.Spec.NodeName != "" {
			w.bound[key] = now
		}
		if _, seen := w.running[key]; !seen && p.Status.Phase == corev1.PodRunning {
			w.running[key] = now
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, n any) { on(n) }}); err != nil {
		t.Fatal(err)
	}
	factory.Start(t.Context().Done())
	factory.WaitForCacheSync(t.Context().Done())
	return w
}

func (w *runningWatch) at(namespace, name string) (bound, running time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := namespace + "/" + name
	bound, running = w.bound[key], w.running[key]
	return bound, running, !running.IsZero()
}

// measureRunning creates pods one at a time, each deleted (and its claim
// gone) before the next, then a burst of burst pods at once, all pinned to
// the real node.
func (s *suite) measureRunning(t *testing.T, w *runningWatch, namespace, template, prefix string, burst, sequential int) runningFigures {
	t.Helper()
	ctx := t.Context()
	waitRunning := func(names []string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, runTimeout, true, func(context.Context) (bool, error) {
			if err := s.alive(); err != nil {
				return false, err
			}
			for _, n := range names {
				if _, _, ok := w.at(namespace, n); !ok {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%s: pods %v not Running: %v\n%s", prefix, names, err, describePod(ctx, s.client, namespace, names[len(names)-1]))
		}
	}
	var fig runningFigures
	var bound, running []time.Duration
	for i := range sequential {
		name := fmt.Sprintf("%s-seq-%02d", prefix, i)
		start := time.Now()
		s.createPod(ctx, t, namespace, name, template, s.realNode)
		waitRunning([]string{name})
		b, r, _ := w.at(namespace, name)
		bound, running = append(bound, b.Sub(start)), append(running, r.Sub(start))
		s.deleteAndWaitGone(t, namespace, []string{name})
	}
	fig.SequentialBoundP50Ms = quantileMs(bound, 0.5)
	fig.SequentialRunningP50Ms, fig.SequentialRunningP99Ms = quantileMs(running, 0.5), quantileMs(running, 0.99)

	names := make([]string, burst)
	for i := range names {
		names[i] = fmt.Sprintf("%s-burst-%02d", prefix, i)
	}
	// Created back to back from this goroutine (createPod fails the test
	// on error, which only the test's goroutine may do): a few ms apart,
	// against the half second each pod takes to run.
	created := make([]time.Time, burst)
	start := time.Now()
	for i, n := range names {
		created[i] = time.Now()
		s.createPod(ctx, t, namespace, n, template, s.realNode)
	}
	waitRunning(names)
	var last time.Time
	running = running[:0]
	for i, n := range names {
		_, r, _ := w.at(namespace, n)
		running = append(running, r.Sub(created[i]))
		if r.After(last) {
			last = r
		}
	}
	fig.BurstRunningP50Ms, fig.BurstRunningP99Ms = quantileMs(running, 0.5), quantileMs(running, 0.99)
	fig.BurstRunningPodsPerSecond = float64(burst) / last.Sub(start).Seconds()
	s.deleteAndWaitGone(t, namespace, names)
	t.Logf("%s: one at a time: create→bound p50 %.0f ms, create→Running p50 %.0f ms p99 %.0f ms; burst of %d: create→Running p50 %.0f ms p99 %.0f ms, %.2f pods/s to Running",
		prefix, fig.SequentialBoundP50Ms, fig.SequentialRunningP50Ms, fig.SequentialRunningP99Ms, burst, fig.BurstRunningP50Ms, fig.BurstRunningP99Ms, fig.BurstRunningPodsPerSecond)
	return fig
}

// deleteAndWaitGone deletes the pods and waits until they and their
// claims are gone, so that their GPUs are free for the next pods. The
// deletion is graceful, as a user's: the kubelet keeps the pod object
// until it has unprepared its claims, so a GPU is never allocated again
// while still prepared for the pod before (a forced deletion lets that
// happen: the plugin then refuses the new claim until the kubelet has
// unprepared the old one, and the kubelet retries after its back-off).
func (s *suite) deleteAndWaitGone(t *testing.T, namespace string, names []string) {
	t.Helper()
	ctx := t.Context()
	for _, n := range names {
		if err := s.client.CoreV1().Pods(namespace).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, runTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := s.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims, err := s.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return slices.Contains(names, p.Name) }) &&
			!slices.ContainsFunc(claims.Items, func(c resourceapi.ResourceClaim) bool {
				return slices.ContainsFunc(c.OwnerReferences, func(o metav1.OwnerReference) bool { return slices.Contains(names, o.Name) })
			}), nil
	})
	if err != nil {
		t.Fatalf("pods %v or their claims not gone: %v", names, err)
	}
}

// quantileMs is the q quantile of d in milliseconds (nearest rank).
func quantileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(float64(len(s))*q))].Microseconds()) / 1000
}
