package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// onDemandInventory is a node of the mock server with all 8 GPUs
// partitioned on demand.
func onDemandInventory(tb testing.TB, server string) *NodeInventory {
	tb.Helper()
	layout := map[int][]string{}
	var all []int
	for g := range 8 {
		layout[g] = nil
		all = append(all, g)
	}
	inv := NewInventory()
	for _, s := range controllertest.OnDemandSlices(tb, server, "n", layout, all...) {
		if err := inv.Upsert(s); err != nil && !strings.Contains(err.Error(), "incomplete") {
			tb.Fatal(err)
		}
	}
	n := inv.Node("n")
	if n == nil {
		tb.Fatalf("no node: %v", inv.ProblemsSnapshot())
	}
	return n
}

// The inventory reads every partition and counter set: 25 partitions per
// A100 and 28 per H100 (the mocks' tables), each in its GPU's table.
func TestOnDemandInventory(t *testing.T) {
	for server, per := range map[string]int{"dgxa100": 25, "dgxh100": 28} {
		n := onDemandInventory(t, server)
		if len(n.OnDemand) != 8 || len(n.MIG) != 8*per || n.Topo.Len() != 0 {
			t.Fatalf("%s: %d GPUs on demand, %d partitions, %d whole GPUs; want 8, %d, 0", server, len(n.OnDemand), len(n.MIG), n.Topo.Len(), 8*per)
		}
		for _, d := range n.MIG {
			if d.OnDemand == nil || n.OnDemand[d.ODPos] != d.OnDemand || d.OnDemand.Index != d.Parent {
				t.Fatalf("%s: partition %s is not tied to its GPU", server, d.Name)
			}
			if pl := d.OnDemand.Table.Placement(d.Part); pl != d.Placement {
				t.Fatalf("%s: partition %s at %+v, its table says %+v", server, d.Name, d.Placement, pl)
			}
		}
	}
}

// The table the placer reads is the counters' rule: for random sets of a
// GPU's partitions, adding them one by one while the table says they fit
// agrees with sliceformat.OnDemandGPU.Fits (the API's counters).
func TestOnDemandTableMatchesCounters(t *testing.T) {
	for _, server := range []string{"dgxa100", "dgxh100"} {
		n := onDemandInventory(t, server)
		od := n.OnDemand[3]
		var parts []*migDevice
		for _, d := range n.MIG {
			if d.OnDemand == od {
				parts = append(parts, d)
			}
		}
		decoded := map[string]*sliceformat.Partition{}
		for i := range od.Decoded.Partitions {
			decoded[od.Decoded.Partitions[i].Device.Name] = &od.Decoded.Partitions[i]
		}
		rng := rand.New(rand.NewPCG(3, 5))
		for range 2000 {
			s := placerState(od)
			var set []*sliceformat.Partition
			for range 1 + rng.IntN(8) {
				d := parts[rng.IntN(len(parts))]
				err := od.Decoded.Fits(append(set, decoded[d.Name]))
				if fits := od.Table.Fits(s, d.Part); fits != (err == nil) {
					t.Fatalf("%s: adding %s to %d partitions: table says %v, counters %v", server, d.Name, len(set), fits, err)
				}
				if err == nil {
					s = od.Table.Add(s, d.Part)
					set = append(set, decoded[d.Name])
				}
			}
		}
	}
}

// migClaimOf is a claim of count MIG devices matching the selector.
func migClaimOf(tb testing.TB, count int, selector string) *Claim {
	tb.Helper()
	class := DeviceClasses()[2]
	if !IsMIGClass(class) {
		tb.Fatalf("DeviceClasses()[2] is %s, not the MIG class", class.Name)
	}
	alt := &Alternative{ResultName: "mig", Class: class, MIG: true, Count: count,
		Selectors: []string{class.Spec.Selectors[0].CEL.Expression, selector}}
	return &Claim{Claim: &resourceapi.ResourceClaim{}, Requests: []*RequestSpec{{Name: "mig", Alternatives: []*Alternative{alt}}}}
}

// Partitions held by claims (the ledger's usage, whoever allocated them)
// are never given again, nor any that overlaps them; a claim of several
// partitions gets them all side by side, or none.
func TestOnDemandPlanCountsHeld(t *testing.T) {
	n := onDemandInventory(t, "dgxa100")
	ctx := context.Background()
	sel := NewSelectorEvaluator()
	used := make([]bool, len(n.MIG))
	byName := map[string]int{}
	for i, d := range n.MIG {
		byName[d.Name] = i
	}
	// Every GPU holds a 3g at 4 and a 2g at 0: a 2g at 2 is all that is left.
	for g := range 8 {
		for _, name := range []string{"gpu-%d-part-3g-20gb-at-4", "gpu-%d-part-2g-10gb-at-0"} {
			used[byName[fmt.Sprintf(name, g)]] = true
		}
	}
	pl, why := planMIGNode(ctx, sel, n, used, []*Claim{migClaimOf(t, 8, controllertest.ProfileSelector("2g.10gb"))})
	if pl == nil {
		t.Fatalf("eight 2g.10gb: no plan: %v", why)
	}
	for _, d := range pl.plan.Claims[0][0].MIG {
		if !strings.HasSuffix(d.Name, "-part-2g-10gb-at-2") {
			t.Errorf("got %s, want only 2g partitions at slice 2", d.Name)
		}
	}
	if got := len(pl.plan.Claims[0][0].Placed); got != 8 {
		t.Errorf("%d placement notes for 8 partitions", got)
	}
	// Nine cannot all be placed: none is.
	pl, why = planMIGNode(ctx, sel, n, used, []*Claim{migClaimOf(t, 9, controllertest.ProfileSelector("2g.10gb"))})
	if pl != nil {
		t.Errorf("nine 2g.10gb placed where eight fit: %s", pl.plan.Summarize())
	} else if !strings.Contains(strings.Join(why, "; "), "8 free MIG devices on node n match it, it wants 9") {
		t.Errorf("nine 2g.10gb: reasons %q do not say that 8 fit", why)
	}
	// 1g.5gb+me: one per GPU (it takes the GPU's extra media engines),
	// so eight fit on the 8 GPUs and nine do not.
	if pl, why := planMIGNode(ctx, sel, n, make([]bool, len(n.MIG)), []*Claim{migClaimOf(t, 8, controllertest.ProfileSelector("1g.5gb+me"))}); pl == nil {
		t.Errorf("eight 1g.5gb+me: no plan: %v", why)
	}
	pl, why = planMIGNode(ctx, sel, n, make([]bool, len(n.MIG)), []*Claim{migClaimOf(t, 9, controllertest.ProfileSelector("1g.5gb+me"))})
	if pl != nil {
		t.Errorf("nine 1g.5gb+me placed on 8 GPUs that allow one each: %s", pl.plan.Summarize())
	} else if !strings.Contains(strings.Join(why, "; "), "56 partitions on node n match it, but no 9 of them fit side by side") {
		t.Errorf("nine 1g.5gb+me: reasons %q do not say they do not fit together", why)
	}
}

// placerState is an empty GPU's state.
func placerState(*onDemandGPU) (s mig.State) { return s }

// The ledger counts a partition named in any claim's allocation result.
func TestOnDemandLedgerCountsResults(t *testing.T) {
	n := onDemandInventory(t, "dgxh100")
	l := NewLedger()
	c := controllertest.ClaimWith("u1", "1", resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver.Name, Pool: "n", Device: "gpu-2-part-3g-40gb-at-4"})
	l.Observe(c)
	used := l.migUsage(n)
	count := 0
	for i, u := range used {
		if u {
			count++
			if n.MIG[i].Name != "gpu-2-part-3g-40gb-at-4" {
				t.Errorf("%s counted as held", n.MIG[i].Name)
			}
		}
	}
	if count != 1 {
		t.Fatalf("%d partitions counted as held, want 1", count)
	}
	// The 4g at 0 of GPU 2 still fits (slices 0-3); the 7g does not.
	ctx := context.Background()
	if pl, _ := planMIGNode(ctx, NewSelectorEvaluator(), n, used, []*Claim{migClaimOf(t, 8, controllertest.ProfileSelector("7g.80gb"))}); pl != nil {
		t.Errorf("eight 7g.80gb placed while GPU 2 holds a 3g: %s", pl.plan.Summarize())
	}
}
