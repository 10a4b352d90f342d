//go:build integration

package controller_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// BenchmarkClaimsPerSecond measures allocation throughput against the real
// API server: 512 gated pods, each with its own one-GPU claim, exist
// before the controller starts (64 nodes of 8 V100s); the clock runs from
// the controller's caches being synced until every claim is allocated and
// every pod ungated. The claims carry gpulink's finalizer from creation,
// as the chart's MutatingAdmissionPolicy leaves them (GPULINK_BENCH_NO_POLICY=1:
// they do not, and the controller adds it), so every allocation is a
// status update and a pod patch.
//
//	go test -tags integration -run '^$' -bench ClaimsPerSecond -benchtime 1x ./test/integration/controller/
func BenchmarkClaimsPerSecond(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		rate, bound := controllerThroughput(b, fmt.Sprintf("bench-%d", i), os.Getenv("GPULINK_BENCH_NO_POLICY") == "")
		b.ReportMetric(rate, "claims/s")
		b.ReportMetric(bound.Seconds(), "s-all-bound")
	}
}

// benchClaims is the number of claims (and pods) of a throughput run: 64
// nodes of 8 GPUs, one GPU each.
const benchNodes, benchPerNode = 64, 8

// controllerThroughput runs the controller over benchClaims pending pods
// created before it starts, and returns claims per second (allocated and
// ungated) and the time until every pod is bound. finalizer creates the
// claims with gpulink's finalizer, as the chart's admission policy does.
func controllerThroughput(b *testing.B, prefix string, finalizer bool) (float64, time.Duration) {
	b.Helper()
	m := map[string]string{}
	for n := range benchNodes {
		m[fmt.Sprintf("%s-%02d", prefix, n)] = "v100-sxm2-8-aliyun-sccgn6.txt"
	}
	e := setup(b, m)
	total := benchNodes * benchPerNode
	for k := range total {
		name := fmt.Sprintf("c%04d", k)
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
		if finalizer {
			c.Finalizers = []string{driver.ClaimFinalizer}
		}
		if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		p := e.newPod(fmt.Sprintf("p%04d", k), true)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
		e.createPod(p)
	}
	sched0 := schedulerCounters(b)
	b.StartTimer()
	ctrl := e.startController(benchWorkers())
	start := time.Now()
	e.poll("all claims allocated and pods ungated", 5*time.Minute, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false
		}
		for _, c := range l.Items {
			if c.Status.Allocation == nil {
				return false
			}
		}
		pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if len(p.Spec.SchedulingGates) > 0 {
				return false
			}
		}
		return len(l.Items) == total
	})
	allocatedAt := time.Since(start)
	b.StopTimer()
	e.poll("all pods bound", 5*time.Minute, func() bool {
		l, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false
		}
		for _, p := range l.Items {
			if p.Spec.NodeName == "" {
				return false
			}
		}
		return true
	})
	boundAt := time.Since(start)
	b.Logf("kube-scheduler during the run: %s", schedulerCounters(b).since(sched0))
	ctrl.stop()
	if err := e.checkInvariants(); err != nil {
		b.Error(err)
	}
	// Gone before the next phase, whose controller would otherwise see
	// (and clean up) these objects while it is measured.
	e.teardown()
	rate := float64(total) / allocatedAt.Seconds()
	b.Logf("controller (finalizer at creation: %v): %d claims allocated and pods ungated in %s (%.0f/s); all pods bound after %s",
		finalizer, total, allocatedAt.Round(time.Millisecond), rate, boundAt.Round(time.Millisecond))
	return rate, boundAt
}

// BenchmarkThroughput prints, in one run, the controller's claims per
// second, the API write ceiling for the same writes and their ratio: with
// the claims carrying gpulink's finalizer from creation (the chart's
// admission policy; two writes per claim) and without (three). The load
// average of the machine before and after is logged with them: on a
// shared machine the figures are only comparable within one run.
//
//	go test -tags integration -run '^$' -bench Throughput -benchtime 1x ./test/integration/controller/
func BenchmarkThroughput(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		load0 := loadAvg()
		type row struct {
			name                 string
			ctrl, ceiling, ratio float64
		}
		var rows []row
		for _, policy := range []bool{true, false} {
			tag := "policy"
			if !policy {
				tag = "nopolicy"
			}
			ceil := writeCeiling(b, fmt.Sprintf("ceil-%d-%s", i, tag), !policy)
			rate, _ := controllerThroughput(b, fmt.Sprintf("tp-%d-%s", i, tag), policy)
			r := row{name: tag, ctrl: rate, ceiling: ceil, ratio: rate / ceil}
			rows = append(rows, r)
			b.ReportMetric(r.ctrl, "claims/s-"+tag)
			b.ReportMetric(r.ceiling, "ceiling/s-"+tag)
			b.ReportMetric(r.ratio, "ratio-"+tag)
		}
		b.Logf("load average before: %s; after: %s (nproc %d)", load0, loadAvg(), runtime.NumCPU())
		for _, r := range rows {
			writes := 2
			if r.name == "nopolicy" {
				writes = 3
			}
			b.Logf("%-9s %d writes/claim: controller %.0f claims/s, write ceiling %.0f claims/s, ratio %.2f", r.name, writes, r.ctrl, r.ceiling, r.ratio)
		}
	}
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// BenchmarkCreateToBound compares pod-create-to-bound latency of the
// gpulink path (gated pod, claim from a template, controller allocates,
// removes the gate, kube-scheduler binds) with the stock kube-scheduler
// path on the same nodes and devices (ungated pod whose request tolerates
// gpulink's taint, so kube-scheduler's own allocator handles it). Pods run
// one at a time; p50 and p90 are reported for both.
func BenchmarkCreateToBound(b *testing.B) {
	const samples = 40
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := setup(b, map[string]string{fmt.Sprintf("lat-%d-a", i): "v100-sxm2-8-aliyun-sccgn6.txt", fmt.Sprintf("lat-%d-b", i): "dgx-a100.txt"})
		ctrl := e.startController(4)
		e.template("gpulink", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
		stock := controllertest.WholeRequest("g", 1)
		stock.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		e.template("stock", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{stock}})
		measure := func(prefix, tpl string, gated bool) []time.Duration {
			var out []time.Duration
			for k := range samples {
				name := fmt.Sprintf("%s-%02d", prefix, k)
				start := time.Now()
				e.createPod(e.newPod(name, gated, tpl))
				e.waitBound(name, time.Minute)
				out = append(out, time.Since(start))
				e.deletePod(name)
			}
			sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
			return out
		}
		b.StartTimer()
		// Interleave a warm-up of each path, then measure both.
		measure("warm-stock", "stock", false)
		measure("warm-gl", "gpulink", true)
		st := measure("stock", "stock", false)
		gl := measure("gpulink", "gpulink", true)
		b.StopTimer()
		ctrl.stop()
		p := func(d []time.Duration, q float64) time.Duration { return d[int(q*float64(len(d)-1))] }
		ratio := float64(p(gl, 0.5)) / float64(p(st, 0.5))
		b.ReportMetric(float64(p(gl, 0.5).Microseconds())/1000, "ms-p50-gpulink")
		b.ReportMetric(float64(p(st, 0.5).Microseconds())/1000, "ms-p50-stock")
		b.ReportMetric(ratio, "p50-ratio")
		b.Logf("create-to-bound p50/p90: gpulink %s/%s, stock kube-scheduler %s/%s, p50 ratio %.2f",
			p(gl, 0.5).Round(time.Millisecond), p(gl, 0.9).Round(time.Millisecond), p(st, 0.5).Round(time.Millisecond), p(st, 0.9).Round(time.Millisecond), ratio)
	}
}

// benchWorkers is the controller's worker count in benchmarks
// (GPULINK_BENCH_WORKERS, default 32 like the binary).
func benchWorkers() int {
	if v, err := strconv.Atoi(os.Getenv("GPULINK_BENCH_WORKERS")); err == nil && v > 0 {
		return v
	}
	return 32
}

// BenchmarkAPIWriteCeiling is the baseline for BenchmarkClaimsPerSecond:
// the same writes per claim (status update with an allocation, pod gate
// patch; and a finalizer update first with GPULINK_BENCH_NO_POLICY=1)
// issued by as many goroutines as the controller has workers, with no
// decision logic at all. The controller cannot allocate faster than this
// on the same machine.
func BenchmarkAPIWriteCeiling(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		b.ReportMetric(writeCeiling(b, fmt.Sprintf("ceil-%d", i), os.Getenv("GPULINK_BENCH_NO_POLICY") != ""), "claims/s")
	}
}

// writeCeiling issues the controller's writes for benchClaims claims with
// benchWorkers goroutines and returns claims per second; withFinalizer
// adds the finalizer update the controller makes when admission did not.
func writeCeiling(b *testing.B, node string, withFinalizer bool) float64 {
	b.Helper()
	total := benchNodes * benchPerNode
	e := setup(b, map[string]string{node: "v100-sxm2-8-aliyun-sccgn6.txt"})
	claims := make([]*resourceapi.ResourceClaim, total)
	pods := make([]*corev1.Pod, total)
	for k := range total {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%04d", k), Namespace: e.ns},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
		if !withFinalizer {
			c.Finalizers = []string{driver.ClaimFinalizer}
		}
		var err error
		if claims[k], err = e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		p := e.newPod(fmt.Sprintf("p%04d", k), true)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(c.Name)}}
		pods[k] = e.createPod(p)
	}
	work := make(chan int, total)
	for k := range total {
		work <- k
	}
	close(work)
	b.StartTimer()
	start := time.Now()
	done := make(chan error, benchWorkers())
	for range benchWorkers() {
		go func() {
			for k := range work {
				c := claims[k].DeepCopy()
				if withFinalizer {
					c.Finalizers = append(c.Finalizers, driver.ClaimFinalizer)
					var err error
					if c, err = e.client.ResourceV1().ResourceClaims(e.ns).Update(e.ctx, c, metav1.UpdateOptions{}); err != nil {
						done <- err
						return
					}
				}
				c.Status.Allocation = &resourceapi.AllocationResult{
					AllocationTimestamp: ptr.To(metav1.Now()),
					Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
						Request: "g", Driver: driver.Name, Pool: node, Device: fmt.Sprintf("gpu-%d", k%8)}}},
				}
				c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pods[k].Name, UID: pods[k].UID}}
				if _, err := e.client.ResourceV1().ResourceClaims(e.ns).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
					done <- err
					return
				}
				patch := []byte(`[{"op":"remove","path":"/spec/schedulingGates/0"}]`)
				if _, err := e.client.CoreV1().Pods(e.ns).Patch(e.ctx, pods[k].Name, apitypes.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range benchWorkers() {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	// The claims deliberately double-book devices: delete the pods before
	// kube-scheduler binds many of them.
	_ = e.client.CoreV1().Pods(e.ns).DeleteCollection(e.ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	e.teardown()
	writes := 2
	if withFinalizer {
		writes = 3
	}
	rate := float64(total) / elapsed.Seconds()
	b.Logf("write ceiling: %d claims written (%d writes each) in %s: %.0f/s", total, writes, elapsed.Round(time.Millisecond), rate)
	return rate
}

// schedCounters are kube-scheduler's scheduling attempts by result, queue
// arrivals by event, its API requests and the time they waited for its
// client-side rate limiter: where pods wait between the lifted gate and
// the binding.
type schedCounters map[string]float64

var schedCounterNames = []string{"scheduler_schedule_attempts_total", "scheduler_queue_incoming_pods_total", "rest_client_rate_limiter_duration_seconds_sum", "rest_client_requests_total"}

func schedulerCounters(b *testing.B) schedCounters {
	b.Helper()
	text, err := cluster.SchedulerMetrics(context.Background())
	if err != nil {
		b.Logf("no kube-scheduler metrics: %v", err)
		return nil
	}
	out := schedCounters{}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		for _, n := range schedCounterNames {
			if strings.HasPrefix(l, n) {
				i := strings.LastIndexByte(l, ' ')
				if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
					out[l[:i]] = v
				}
			}
		}
	}
	return out
}

// since renders the counters that grew since before.
func (c schedCounters) since(before schedCounters) string {
	var parts []string
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s +%.0f", k, d))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}
