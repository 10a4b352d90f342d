package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// BenchmarkPlanOneGPU measures one decision (no API writes) for a one-GPU
// claim on a cluster of 64 eight-GPU V100 nodes, half full.
func BenchmarkPlanOneGPU(b *testing.B) {
	benchmarkPlan(b, controllertest.WholeRequest("g", 1))
}

// BenchmarkPlanShare is the same for a share.
func BenchmarkPlanShare(b *testing.B) {
	benchmarkPlan(b, controllertest.ShareRequest("s", "2Gi", "20"))
}

func benchmarkPlan(b *testing.B, req resourceapi.DeviceRequest) {
	topo, err := parseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		b.Fatal(err)
	}
	inv := newInventory()
	l := newLedger()
	for n := range 64 {
		s, err := controllertest.Slice(fmt.Sprintf("node-%02d", n), topo, controllertest.SliceOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := inv.upsert(s); err != nil {
			b.Fatal(err)
		}
		var uses []deviceUse
		for i := range n % 8 {
			uses = append(uses, deviceUse{Key: deviceKey{Pool: s.Spec.Pool.Name, Device: fmt.Sprintf("gpu-%d", i)}, Exclusive: true})
		}
		l.setLocked(testUID(n), &claimUse{uses: uses})
	}
	sel := newSelectorEvaluator()
	classes := map[string]*resourceapi.DeviceClass{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	ip := &interpreter{classes: fakeClassLister(classes), cel: sel, inv: inv}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}}
	ctx := context.Background()
	pol := allocate.Policy{}
	b.ResetTimer()
	for b.Loop() {
		ic, _, err := ip.interpret(ctx, claim)
		if err != nil {
			b.Fatal(err)
		}
		var plans []*nodePlan
		for _, n := range inv.all() {
			if p, _ := planNode(ctx, sel, pol, n, l.nodeUsage(n), []*interpretedClaim{ic}); p != nil {
				plans = append(plans, p)
			}
		}
		if choosePlan(plans, pol) == nil {
			b.Fatal("no plan")
		}
	}
}

// BenchmarkDecision5000Nodes measures one decision (no API writes: the
// choice made under the decision lock) over 5,000 in-memory eight-GPU
// nodes of mixed kinds with random usage, for the scale test's mix of
// pods, planning every node (exhaustive) and with quickChoice (quick).
// It reports the p50 and p99 of one decision.
func BenchmarkDecision5000Nodes(b *testing.B) {
	rng := rand.New(rand.NewPCG(5000, 8))
	eight := []string{"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
		"v100-sxm2-8-aliyun-sccgn6.txt", "pcie-nvbridge-8.txt", "pcie-pex-8.txt", "pcie-switch-8.txt"}
	pc := newPruneCluster(b, rng, 5000, eight, 0.7)
	cands := pc.inv.all()
	ctx := context.Background()
	whole := func(n int64, cfg ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", n)}, Config: cfg}}}
	}
	share := func(mem, cores string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", mem, cores)}}}}
	}
	// The scale test's mix (test/scale, scaleRequests), by weight.
	var mix []*interpretedClaim
	for _, w := range []struct {
		n  int
		cl *resourceapi.ResourceClaim
	}{{35, whole(1)}, {20, whole(2)}, {12, whole(4)}, {3, whole(8)}, {5, whole(2, controllertest.RequiredNVLinkConfig())},
		{15, share("4Gi", "25")}, {10, share("12Gi", "50")}} {
		ic, _, err := pc.ip.interpret(ctx, w.cl)
		if err != nil {
			b.Fatal(err)
		}
		for range w.n {
			mix = append(mix, ic)
		}
	}
	pol := allocate.Policy{}
	run := func(b *testing.B, decide func([]*interpretedClaim) *nodePlan) {
		// Selector results and share sizes are memoised per node: the
		// first decision for each kind of request pays for them once.
		for j := range mix {
			decide([]*interpretedClaim{mix[j]})
		}
		var took []time.Duration
		i := 0
		for b.Loop() {
			start := time.Now()
			if decide([]*interpretedClaim{mix[i%len(mix)]}) == nil {
				b.Fatal("no plan")
			}
			took = append(took, time.Since(start))
			i += 37
		}
		slices.Sort(took)
		p := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
		b.ReportMetric(p(0.5), "p50-ms")
		b.ReportMetric(p(0.99), "p99-ms")
	}
	b.Run("exhaustive", func(b *testing.B) {
		run(b, func(pending []*interpretedClaim) *nodePlan {
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, cands, pc.usageOf, pending)
			return choosePlan(plans, pol)
		})
	})
	b.Run("quick", func(b *testing.B) {
		run(b, func(pending []*interpretedClaim) *nodePlan {
			pl, ok := quickChoice(ctx, pc.sel, pol, cands, pc.usageOf, pending)
			if !ok {
				b.Fatal("shortcut did not apply")
			}
			return pl
		})
	})
}
