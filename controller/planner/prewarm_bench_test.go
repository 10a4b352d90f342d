package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// costlySelector is a selector the API server accepts (its cost is known
// when it is compiled: two comprehensions over list literals of n
// numbers, about 7n² cost units) whose evaluation on a device costs what
// n makes it: n 300 is about 630,000 units, n 380 the API's limit. salt
// makes each claim's expression distinct, so that no memo serves it.
func costlySelector(n, salt int) string {
	nums := make([]string, n)
	for i := range nums {
		nums[i] = fmt.Sprint(i)
	}
	list := "[" + strings.Join(nums, ",") + "]"
	return fmt.Sprintf(`%s.all(x, %s.all(y, x + y >= 0)) && %d >= 0`, list, list, salt)
}

// BenchmarkCostlySelector measures what one claim with a costly selector
// does to the decisions of everyone else, on 64 eight-GPU nodes: the
// decision lock is held for each decision's choice, so a choice that
// evaluates the selector on every device holds every other pod's
// decision for that long. ordinary is a one-GPU claim's choice;
// costly-under-lock is the costly claim's choice as it was made, the
// selector evaluated on every node inside it (lock-ms); costly-prepared
// evaluates it first with PrepareSelectors, outside the lock
// (prepare-ms), and then chooses (lock-ms). eval-ms-per-device is one
// evaluation of the selector; GPULINK_COSTLY_N sets n (default 60, about
// 26,000 cost units; 380 is at the API's limit).
func BenchmarkCostlySelector(b *testing.B) {
	n := 60
	if v := strings.TrimSpace(os.Getenv("GPULINK_COSTLY_N")); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil {
			b.Fatalf("GPULINK_COSTLY_N %q: %v", v, err)
		}
	}
	pc := newPruneCluster(b, rand.New(rand.NewPCG(64, 1)), 64, controllertest.EightGPUFixtures, 0.5)
	nodes := pc.inv.All()
	filter := benchNodeFilter(b, nodes)
	ctx := context.Background()
	logger := klog.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "pod"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	claim := func(selector string) []*Claim {
		req := controllertest.WholeRequest("gpus", 1)
		if selector != "" {
			req.Exactly.Selectors = append(req.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: selector}})
		}
		ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}})
		if err != nil {
			b.Fatal(err)
		}
		return []*Claim{ic}
	}
	scores := newScoreCache()
	choose := func(pending []*Claim) {
		pf := filter.forPod(logger, pod, nil, nil)
		if _, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, scores, pf.admit, pending, nil); verdict == quickNoFit {
			b.Fatal("nothing fits")
		}
	}
	// One evaluation on one device, for scale.
	prog, err := pc.sel.compile(costlySelector(n, -1))
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, _, err := prog.DeviceMatches(ctx, nodes[0].Devices[0].CEL); err != nil {
		b.Fatal(err)
	}
	evalMS := float64(time.Since(start).Microseconds()) / 1000
	salt := 0
	run := func(b *testing.B, selector bool, prepare bool) {
		var lock, prep time.Duration
		for b.Loop() {
			sel := ""
			if selector {
				salt++
				sel = costlySelector(n, salt)
			}
			pending := claim(sel)
			start := time.Now()
			if prepare {
				if err := pc.sel.prepare(ctx, nodes, pending); err != nil {
					b.Fatal(err)
				}
			}
			mid := time.Now()
			choose(pending)
			prep += mid.Sub(start)
			lock += time.Since(mid)
		}
		b.ReportMetric(float64(lock.Microseconds())/1000/float64(b.N), "lock-ms")
		b.ReportMetric(float64(prep.Microseconds())/1000/float64(b.N), "prepare-ms")
		b.ReportMetric(evalMS, "eval-ms-per-device")
	}
	b.Run("ordinary", func(b *testing.B) { run(b, false, false) })
	b.Run("costly-under-lock", func(b *testing.B) { run(b, true, false) })
	b.Run("costly-prepared", func(b *testing.B) { run(b, true, true) })
}
