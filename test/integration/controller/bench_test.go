//go:build integration

package controller_test

import (
	"fmt"
	"os"
	"sort"
	"strconv"
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
// the controller's caches being synced until every claim is allocated.
// Every allocation is a finalizer update, a status update and a pod patch.
//
//	go test -tags integration -run '^$' -bench ClaimsPerSecond -benchtime 1x ./test/integration/controller/
func BenchmarkClaimsPerSecond(b *testing.B) {
	const nodes, perNode = 64, 8
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		m := map[string]string{}
		for n := range nodes {
			m[fmt.Sprintf("bench-%d-%02d", i, n)] = "v100-sxm2-8-aliyun-sccgn6.txt"
		}
		e := setup(b, m)
		total := nodes * perNode
		for k := range total {
			name := fmt.Sprintf("c%04d", k)
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
			if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			p := e.newPod(fmt.Sprintf("p%04d", k), true)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
			e.createPod(p)
		}
		b.StartTimer()
		ctrl := e.startController(benchWorkers())
		start := time.Now()
		var allocatedAt time.Duration
		e.poll("all claims allocated", 5*time.Minute, func() bool {
			l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{ResourceVersion: "0"})
			if err != nil {
				return false
			}
			n := 0
			for _, c := range l.Items {
				if c.Status.Allocation != nil {
					n++
				}
			}
			return n == total
		})
		allocatedAt = time.Since(start)
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
		b.StopTimer()
		ctrl.stop()
		if err := e.checkInvariants(); err != nil {
			b.Error(err)
		}
		b.ReportMetric(float64(total)/allocatedAt.Seconds(), "claims/s")
		b.ReportMetric(boundAt.Seconds(), "s-all-bound")
		b.Logf("%d claims allocated in %s (%.0f/s); all pods bound after %s", total, allocatedAt.Round(time.Millisecond), float64(total)/allocatedAt.Seconds(), boundAt.Round(time.Millisecond))
	}
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
// the same three writes per claim (finalizer update, status update with
// an allocation, pod gate patch) issued by as many goroutines as the
// controller has workers, with no decision logic at all. The controller
// cannot allocate faster than this on the same machine.
func BenchmarkAPIWriteCeiling(b *testing.B) {
	const total = 512
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := setup(b, map[string]string{fmt.Sprintf("ceil-%d", i): "v100-sxm2-8-aliyun-sccgn6.txt"})
		claims := make([]*resourceapi.ResourceClaim, total)
		pods := make([]*corev1.Pod, total)
		for k := range total {
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%04d", k), Namespace: e.ns},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
			var err error
			if claims[k], err = e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			p := e.newPod(fmt.Sprintf("p%04d", k), true)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(c.Name)}}
			pods[k] = e.createPod(p)
		}
		node := fmt.Sprintf("ceil-%d", i)
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
					c.Finalizers = append(c.Finalizers, driver.ClaimFinalizer)
					c, err := e.client.ResourceV1().ResourceClaims(e.ns).Update(e.ctx, c, metav1.UpdateOptions{})
					if err != nil {
						done <- err
						return
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
		// The claims deliberately double-book devices: delete the pods
		// before kube-scheduler binds many of them.
		_ = e.client.CoreV1().Pods(e.ns).DeleteCollection(e.ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		b.ReportMetric(float64(total)/elapsed.Seconds(), "claims/s")
		b.Logf("%d claims written (3 writes each) in %s: %.0f/s", total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds())
	}
}
