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
//
// A selector already evaluated on every node at the inventory's current
// generation is skipped: the memos it filled are only replaced with a
// node's slices, which moves the generation. Without this every pod paid
// a memo lookup per node and selector before each decision, a quarter of
// the controller's CPU at 5,000 nodes (make scale's profile). A row
// evicted since (memoEntriesPerNode) is evaluated by Decide as before.
func (p *Planner) PrepareSelectors(ctx context.Context, pending []*Claim) error {
	// The generation is read before the nodes: a change in between leaves
	// the record at the older generation, so the next call evaluates again.
	done := p.sel.preparedAt(p.inv.Generation())
	return p.sel.prepareNodes(ctx, p.inv.sortedNodes(), pending, done)
}

// prepare is PrepareSelectors over the given nodes, every selector
// evaluated (memo lookups included).
func (e *SelectorEvaluator) prepare(ctx context.Context, nodes []*NodeInventory, pending []*Claim) error {
	return e.prepareNodes(ctx, nodes, pending, nil)
}

// preparedSelectors is the set of selectors evaluated on every node of
// the inventory at one generation. The key tells MIG rows apart
// (migMemoPrefix), as the memos do.
type preparedSelectors struct {
	generation uint64
	keys       map[string]struct{}
}

// maxPreparedSelectors bounds the set between two changes of the
// inventory: pods may carry any number of distinct selectors.
const maxPreparedSelectors = 4096

// preparedAt returns the record of the selectors prepared at generation
// gen, a new, empty one when the inventory has moved since.
func (e *SelectorEvaluator) preparedAt(gen uint64) *preparedSelectors {
	e.preparedMu.Lock()
	defer e.preparedMu.Unlock()
	if e.prepared == nil || e.prepared.generation != gen || len(e.prepared.keys) > maxPreparedSelectors {
		e.prepared = &preparedSelectors{generation: gen, keys: map[string]struct{}{}}
	}
	return e.prepared
}

func (e *SelectorEvaluator) isPrepared(done *preparedSelectors, key string) bool {
	if done == nil {
		return false
	}
	e.preparedMu.Lock()
	defer e.preparedMu.Unlock()
	_, ok := done.keys[key]
	return ok
}

func (e *SelectorEvaluator) markPrepared(done *preparedSelectors, key string) {
	if done == nil {
		return
	}
	e.preparedMu.Lock()
	defer e.preparedMu.Unlock()
	done.keys[key] = struct{}{}
}

// prepareNodes evaluates the pending claims' selectors on the nodes,
// skipping those done records as evaluated on all of them (nil: none).
func (e *SelectorEvaluator) prepareNodes(ctx context.Context, nodes []*NodeInventory, pending []*Claim, done *preparedSelectors) error {
	for _, c := range pending {
		for _, r := range c.Requests {
			for _, alt := range r.Alternatives {
				for _, x := range alt.Selectors {
					if _, err := e.compile(x); err != nil {
						continue
					}
					key := x
					if alt.MIG {
						key = migMemoPrefix + x
					}
					if e.isPrepared(done, key) {
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
					e.markPrepared(done, key)
				}
			}
		}
	}
	return nil
}
