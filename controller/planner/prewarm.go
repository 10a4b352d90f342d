package planner

import (
	"context"
	"fmt"
)

// PrepareSelectors evaluates the CEL selectors of the pending claims on
// every node's devices before the decision, filling the nodes' selector
// memos, so that Decide, which runs under the controller's decision lock,
// finds them evaluated.
//
// Why outside the lock: a selector is the claim author's, and one at the
// API's cost limit (resourceapi.CELSelectorExpressionMaxCost, 1,000,000)
// takes seconds per device (630,000 units took 1.6 s once on the loaded
// 2-core development machine; BenchmarkCostlySelector measures 26,000);
// evaluated on every node under the lock it would stop every other pod's decision for
// as long as its evaluation on the whole cluster takes. Here it costs its
// own worker's time. The memos are per node inventory, safe for concurrent
// use and replaced with the node's slices; a row evicted again before
// Decide (a node's memo keeps memoEntriesPerNode expressions) is evaluated
// under the lock as before, so this only moves work, it changes no
// decision.
//
// It returns ctx's error when ctx ends (its deadline: the caller bounds
// the time one attempt may spend, and the rows of the nodes done so far
// stay memoised for the next attempt), nothing for a selector that does
// not compile (Decide reports it).
func (p *Planner) PrepareSelectors(ctx context.Context, pending []*Claim) error {
	return p.sel.prepare(ctx, p.inv.All(), pending)
}

// prepare is PrepareSelectors over the given nodes.
func (e *SelectorEvaluator) prepare(ctx context.Context, nodes []*NodeInventory, pending []*Claim) error {
	for _, c := range pending {
		for _, r := range c.Requests {
			for _, alt := range r.Alternatives {
				for _, x := range alt.Selectors {
					if _, err := e.compile(x); err != nil {
						continue
					}
					for _, n := range nodes {
						if err := ctx.Err(); err != nil {
							return fmt.Errorf("evaluating the selectors of claim %s/%s: %w", c.Claim.Namespace, c.Claim.Name, err)
						}
						var err error
						if alt.MIG {
							_, err = e.matchesMIGOnNode(ctx, n, x)
						} else {
							_, err = e.matchesOnNode(ctx, n, x)
						}
						if err != nil && ctx.Err() != nil {
							return fmt.Errorf("evaluating the selectors of claim %s/%s: %w", c.Claim.Namespace, c.Claim.Name, ctx.Err())
						}
					}
				}
			}
		}
	}
	return nil
}
