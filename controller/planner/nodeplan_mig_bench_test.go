package planner

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// BenchmarkMIGPlanNode is one MIG decision on one node: a DGX A100 whose 8
// GPUs are split into 7 1g.5gb devices each, half of them allocated (every
// other device), for a request of 2 1g.5gb devices. The target is
// under 50µs per node.
func BenchmarkMIGPlanNode(b *testing.B) {
	layout := map[int][]string{}
	for g := range 8 {
		layout[g] = []string{"1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"}
	}
	inv := NewInventory()
	if err := inv.Upsert(controllertest.MIGSlice(b, "a100", layout)); err != nil {
		b.Fatal(err)
	}
	n := inv.Node("a100")
	used := make([]bool, len(n.MIG))
	for i := range used {
		used[i] = i%2 == 0
	}
	class := DeviceClasses()[2]
	if !IsMIGClass(class) {
		b.Fatalf("DeviceClasses()[2] is %s, not the MIG class", class.Name)
	}
	alt := &Alternative{ResultName: "mig", Class: class, MIG: true, Count: 2,
		Selectors: []string{class.Spec.Selectors[0].CEL.Expression, controllertest.ProfileSelector("1g.5gb")}}
	claims := []*Claim{{Claim: &resourceapi.ResourceClaim{}, Requests: []*RequestSpec{{Name: "mig", Alternatives: []*Alternative{alt}}}}}
	sel := NewSelectorEvaluator()
	ctx := context.Background()
	if pl, why := planMIGNode(ctx, sel, n, used, claims); pl == nil || len(pl.plan.Claims[0][0].MIG) != 2 {
		b.Fatalf("no plan: %v", why)
	}
	b.ReportAllocs()
	for b.Loop() {
		planMIGNode(ctx, sel, n, used, claims)
	}
}
