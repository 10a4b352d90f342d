package planner

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/gpulink/gpulink/driver/allocate"
)

// The GPU products a request's selectors admit, for the demand mix of
// ranking by stranding (allocate.DemandShape.Products).
//
// A pod pinned to a GPU model (a claim or class selecting
// device.attributes["gpu.gpulink.dev"].productName, or anything else
// only some models have, such as their memory) can run only on the nodes
// of those models. Recorded without its products, its shape counts as
// runnable anywhere, so the scarcity of the pinned models is not seen and
// pods that may run anywhere take them first (FGD's trace with GPU-model
// constraints, docs/performance/trace.md). Rather than reading the CEL
// expressions, which may test the product in many ways, the selectors are
// evaluated on a few nodes of each product the cluster has: the products
// on whose nodes some device passes them are the ones admitted. The
// answer is kept per selector list until a node's inventory changes.

// repsPerProduct is how many nodes of each product stand for it: nodes of
// one product normally publish the same attributes, and a few guard
// against one odd node (another driver version, a MIG layout).
const repsPerProduct = 4

// maxProductKeys bounds the kept answers; the cache is simply reset when
// full (claims of one template share one selector list).
const maxProductKeys = 256

// productAdmission keeps the products each selector list admits. Only
// decisions and the start-up seed use it, under Controller.decideMu or
// before any decision.
type productAdmission struct {
	inv *Inventory
	sel *SelectorEvaluator
	// gen is the inventory generation reps was taken at.
	gen  uint64
	reps map[string][]*NodeInventory // product -> nodes standing for it
	// unnamed is set when some node's GPUs name no product: a selector
	// admitting it cannot be told apart from one admitting any product.
	unnamed []*NodeInventory
	byKey   map[string]string
	// products are reps' keys, sorted (names).
	products []string
}

func newProductAdmission(inv *Inventory, sel *SelectorEvaluator) *productAdmission {
	return &productAdmission{inv: inv, sel: sel, gen: ^uint64(0)}
}

// of returns the products the selectors admit, as DemandShape.Products
// names them: "" when there are no selectors, when they admit every
// product of the cluster or none of them, or when they admit a node whose
// GPUs name no product (the shape then counts as runnable anywhere, as
// before products were known).
func (a *productAdmission) of(ctx context.Context, selectors []string) string {
	if a == nil || len(selectors) == 0 || a.inv == nil || a.sel == nil {
		return ""
	}
	a.refresh()
	key := strings.Join(selectors, "\x00")
	if p, ok := a.byKey[key]; ok {
		return p
	}
	p := a.evaluate(ctx, selectors)
	if len(a.byKey) >= maxProductKeys {
		clear(a.byKey)
	}
	a.byKey[key] = p
	return p
}

// refresh takes the representatives again when a node's inventory
// changed since they were taken.
func (a *productAdmission) refresh() {
	if g := a.inv.Generation(); g != a.gen || a.reps == nil {
		a.gen = g
		a.represent()
	}
}

// names lists the GPU products of the cluster's nodes, sorted, for the
// demand history's assumed products (allocate.DemandHistory.AssumeProducts);
// nil without an inventory.
func (a *productAdmission) names() []string {
	if a == nil || a.inv == nil {
		return nil
	}
	a.refresh()
	return a.products
}

// represent takes the first repsPerProduct nodes of each product, by node
// name, and forgets the kept answers.
func (a *productAdmission) represent() {
	a.reps = map[string][]*NodeInventory{}
	a.unnamed = nil
	a.byKey = map[string]string{}
	for _, n := range a.inv.All() {
		if n.Topo == nil || n.Topo.Len() == 0 {
			continue
		}
		product := n.Topo.GPUs[0].ProductName
		if product == "" {
			if len(a.unnamed) < repsPerProduct {
				a.unnamed = append(a.unnamed, n)
			}
			continue
		}
		if len(a.reps[product]) < repsPerProduct {
			a.reps[product] = append(a.reps[product], n)
		}
	}
	a.products = slices.Sorted(maps.Keys(a.reps))
}

func (a *productAdmission) evaluate(ctx context.Context, selectors []string) string {
	if a.admitsAny(ctx, a.unnamed, selectors) {
		return ""
	}
	var admitted []string
	for product, nodes := range a.reps {
		if a.admitsAny(ctx, nodes, selectors) {
			admitted = append(admitted, product)
		}
	}
	if len(admitted) == 0 || (len(admitted) == len(a.reps) && len(a.unnamed) == 0) {
		return ""
	}
	return allocate.ProductsKey(admitted)
}

// admitsAny tells whether some device of the nodes passes every selector
// (memoised per node by the selector evaluator). A selector that does not
// compile admits nothing; the decision that placed the pod passed them,
// so that does not happen for a recorded pod.
func (a *productAdmission) admitsAny(ctx context.Context, nodes []*NodeInventory, selectors []string) bool {
	for _, n := range nodes {
		eligible, _, err := a.sel.eligibleBySelectors(ctx, n, selectors)
		if err == nil && slices.Contains(eligible, true) {
			return true
		}
	}
	return false
}
