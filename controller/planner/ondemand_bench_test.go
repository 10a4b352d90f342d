package planner

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/mig"
)

// BenchmarkOnDemandPlanNode is one MIG-on-demand decision on one node: a
// DGX A100 (or H100) whose 8 GPUs are partitioned on demand, each holding
// a random half-full set of partitions, for a request of one 1g partition
// placed with look-ahead (selectors memoised, as after the first decision
// on a node). The target is under 50µs per node.
func BenchmarkOnDemandPlanNode(b *testing.B) {
	for _, c := range []struct{ server, profile string }{{"dgxa100", "1g.5gb"}, {"dgxh100", "1g.10gb"}} {
		b.Run(c.server, func(b *testing.B) {
			n := onDemandInventory(b, c.server)
			used := make([]bool, len(n.MIG))
			states := make([]mig.State, len(n.OnDemand))
			rng := rand.New(rand.NewPCG(1, 2))
			for range 200 {
				i := rng.IntN(len(n.MIG))
				d := n.MIG[i]
				s := &states[d.ODPos]
				if s.Compute+d.OnDemand.Table.Profiles[d.Part.Profile].ComputeSlices > 3 || !d.OnDemand.Table.Fits(*s, d.Part) {
					continue
				}
				*s = d.OnDemand.Table.Add(*s, d.Part)
				used[i] = true
			}
			claims := []*Claim{migClaimOf(b, 1, controllertest.ProfileSelector(c.profile))}
			sel := NewSelectorEvaluator()
			ctx := context.Background()
			if pl, why := planMIGNode(ctx, sel, n, used, claims); pl == nil {
				b.Fatalf("no plan: %v", why)
			}
			b.ReportAllocs()
			for b.Loop() {
				planMIGNode(ctx, sel, n, used, claims)
			}
		})
	}
}
