package controller

import (
	"context"
	"fmt"
	"testing"

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
