package planner

import (
	"context"
	"strings"

	"github.com/gpulink/gpulink/driver/allocate"
)

// Choosing a node for a pod's MIG claims, and merging that plan with its
// whole-GPU and share plan.

// chooseMIGPlan ranks feasible MIG plans (see the package order above).
func chooseMIGPlan(plans []*migPlan) *Plan {
	if len(plans) == 0 {
		return nil
	}
	best := plans[0]
	for _, pl := range plans[1:] {
		a, b := pl, best
		switch {
		case a.plan.RankSum != b.plan.RankSum:
			if a.plan.RankSum < b.plan.RankSum {
				best = pl
			}
		case a.loss != b.loss:
			if a.loss.Compare(b.loss) < 0 {
				best = pl
			}
		case a.packed != b.packed:
			if a.packed > b.packed {
				best = pl
			}
		case a.slices != b.slices:
			if a.slices < b.slices {
				best = pl
			}
		case a.plan.Node.tie() < b.plan.Node.tie():
			best = pl
		}
	}
	return best.plan
}

// chooseMIG chooses the node and devices for a pod whose pending claims
// ask for MIG devices among the candidate nodes: every candidate is
// planned, its MIG claims by planMIGNode and its other claims (whole GPUs,
// shares) by planNode on the same node. A pod with MIG claims only is
// ranked by chooseMIGPlan; one with both by choosePlan over its GPU
// placements (its MIG devices are packed within the node either way). It
// returns the chosen plan (nil when nothing fits), the feasible plans, why
// nodes failed (a sample) and how many failed.
func chooseMIG(ctx context.Context, sel *SelectorEvaluator, pol allocate.Policy, cands []*NodeInventory, l *Ledger, pending []*Claim, rank *hostRanking) (*Plan, []*Plan, []string, int) {
	var migClaims, gpuClaims []*Claim
	for _, ic := range pending {
		if isMIGClaim(ic) {
			migClaims = append(migClaims, ic)
		} else {
			gpuClaims = append(gpuClaims, ic)
		}
	}
	var mps []*migPlan
	var why []string
	failed := 0
	for _, n := range cands {
		mp, reasons := planMIGNode(ctx, sel, n, l.migUsage(n), migClaims)
		if mp != nil && len(gpuClaims) > 0 {
			var gp *Plan
			if gp, reasons = planNode(ctx, sel, pol, n, l.NodeUsage(n), gpuClaims); gp == nil {
				mp = nil
			} else {
				mp.plan = mergePlans(pending, mp.plan, migClaims, gp, gpuClaims)
			}
		}
		if mp == nil {
			failed++
			if len(why) < 8 {
				why = append(why, reasons...)
			}
			continue
		}
		mps = append(mps, mp)
	}
	plans := make([]*Plan, len(mps))
	for i, m := range mps {
		plans[i] = m.plan
	}
	if len(gpuClaims) > 0 {
		return choosePlan(plans, pol, rank), plans, why, failed
	}
	return chooseMIGPlan(mps), plans, why, failed
}

// mergePlans is the plan of all pending claims on one node from the plan
// of its MIG claims and the plan of its other claims, with Claims in
// pending's order (buildAllocation takes them in that order).
func mergePlans(pending []*Claim, mig *Plan, migClaims []*Claim, gpu *Plan, gpuClaims []*Claim) *Plan {
	out := &Plan{Node: gpu.Node, Base: gpu.Base, RankSum: mig.RankSum + gpu.RankSum}
	of := map[*Claim][]PlacedResult{}
	for i, ic := range migClaims {
		of[ic] = mig.Claims[i]
	}
	for i, ic := range gpuClaims {
		of[ic] = gpu.Claims[i]
	}
	for _, ic := range pending {
		out.Claims = append(out.Claims, of[ic])
	}
	return out
}

// migUsage tells, per MIG device of the node, whether any claim holds it.
func (l *Ledger) migUsage(n *NodeInventory) []bool {
	out := make([]bool, len(n.MIG))
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, d := range n.MIG {
		out[i] = l.usage[DeviceKey{Pool: n.Pool, Device: d.Name}] != nil
	}
	return out
}

// MIGPlacementNote tells where the plan's partitions of GPUs partitioned on
// demand went and why, for the allocation's event: "; placed 1g.5gb at
// memory slice 6 of gpu-0; keeps a 4g, a 3g possible there (...)". Empty
// when the plan has none.
func (pl *Plan) MIGPlacementNote() string {
	var notes []string
	for _, claim := range pl.Claims {
		for _, r := range claim {
			notes = append(notes, r.Placed...)
		}
	}
	if len(notes) == 0 {
		return ""
	}
	note := "; " + strings.Join(notes, "; ")
	if len(note) > MaxEventNote/4 {
		note = note[:MaxEventNote/4-3] + "..."
	}
	return note
}
