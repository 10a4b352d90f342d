package planner

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// PrepareSelectors leaves every node's selector rows memoised for Decide;
// an attempt cut short by its context keeps the nodes it finished and no
// row of a node it did not (which would make that node's devices count
// as not matching).
func TestPrepareSelectorsMemoisesAndIsNotPoisonedByItsDeadline(t *testing.T) {
	pc := newPruneCluster(t, rand.New(rand.NewPCG(4, 1)), 4, controllertest.EightGPUFixtures, 0)
	nodes := pc.inv.All()
	const expr = `device.driver == "gpu.gpulink.dev"`
	req := controllertest.WholeRequest("gpus", 1)
	req.Exactly.Selectors = append(req.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	ic, _, err := pc.ip.Interpret(context.Background(), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}})
	if err != nil {
		t.Fatal(err)
	}
	memoised := func(n *NodeInventory) bool {
		n.memoMu.Lock()
		defer n.memoMu.Unlock()
		_, ok := n.memo.get(expr)
		return ok
	}

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := pc.sel.prepare(cancelled, nodes, []*Claim{ic}); err == nil {
		t.Fatal("an attempt whose context ended reported success")
	}
	for _, n := range nodes {
		if memoised(n) {
			t.Errorf("node %s: a row evaluated under an ended context was kept", n.Node)
		}
	}
	if err := pc.sel.prepare(context.Background(), nodes, []*Claim{ic}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if !memoised(n) {
			t.Errorf("node %s: no memoised row after PrepareSelectors", n.Node)
		}
		elig, _, err := pc.sel.eligibleBySelectors(context.Background(), n, []string{expr})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(elig, false) {
			t.Errorf("node %s: devices %v do not match a selector every gpulink device matches", n.Node, elig)
		}
	}
}

// An attempt whose deadline passes in the middle of a node's devices
// keeps no row for that node: the devices not evaluated would otherwise
// be memoised as not matching, and Decide would never give them to the
// claim.
func TestPrepareSelectorsDeadlineInsideANode(t *testing.T) {
	pc := newPruneCluster(t, rand.New(rand.NewPCG(1, 1)), 1, controllertest.EightGPUFixtures, 0)
	nodes := pc.inv.All()
	expr := costlySelector(100, 0)
	req := controllertest.WholeRequest("gpus", 1)
	req.Exactly.Selectors = append(req.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	ic, _, err := pc.ip.Interpret(context.Background(), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}})
	if err != nil {
		t.Fatal(err)
	}
	// Far less than eight evaluations of this selector take.
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = pc.sel.prepare(short, nodes, []*Claim{ic})
	if short.Err() == nil {
		t.Skip("the selector was evaluated on all eight devices within 20ms; nothing to check on this machine")
	}
	if err == nil {
		t.Error("an attempt whose deadline passed reported success")
	}
	elig, _, err := pc.sel.eligibleBySelectors(context.Background(), nodes[0], []string{expr})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(elig, false) {
		t.Errorf("devices %v: a row cut short by the deadline was kept", elig)
	}
}

// PrepareSelectors evaluates a selector on every node once per inventory
// generation: called again with nothing changed it looks at no node (a
// row dropped meanwhile stays dropped, for Decide to evaluate), and once
// a node's slices change it evaluates the selector on every node again.
func TestPrepareSelectorsOncePerInventoryGeneration(t *testing.T) {
	pc := newPruneCluster(t, rand.New(rand.NewPCG(5, 1)), 4, controllertest.EightGPUFixtures, 0)
	p := &Planner{inv: pc.inv, sel: pc.sel}
	const expr = `device.driver == "gpu.gpulink.dev"`
	req := controllertest.WholeRequest("gpus", 1)
	req.Exactly.Selectors = append(req.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	ic, _, err := pc.ip.Interpret(context.Background(), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}})
	if err != nil {
		t.Fatal(err)
	}
	memoised := func(n *NodeInventory) bool {
		n.memoMu.Lock()
		defer n.memoMu.Unlock()
		_, ok := n.memo.get(expr)
		return ok
	}
	forget := func(n *NodeInventory) {
		n.memoMu.Lock()
		defer n.memoMu.Unlock()
		n.memo = newLRU[[]selectorOutcome](memoEntriesPerNode)
	}

	if err := p.PrepareSelectors(context.Background(), []*Claim{ic}); err != nil {
		t.Fatal(err)
	}
	nodes := pc.inv.All()
	for _, n := range nodes {
		if !memoised(n) {
			t.Fatalf("node %s: no memoised row after PrepareSelectors", n.Node)
		}
	}
	forgotten := nodes[0]
	forget(forgotten)
	if err := p.PrepareSelectors(context.Background(), []*Claim{ic}); err != nil {
		t.Fatal(err)
	}
	if memoised(forgotten) {
		t.Errorf("node %s: evaluated again with the inventory unchanged", forgotten.Node)
	}

	// Another node's slices change: the generation moves.
	changed := pc.slices[nodes[1].Node].DeepCopy()
	changed.Spec.Pool.Generation++
	if err := pc.inv.Upsert(changed); err != nil {
		t.Fatal(err)
	}
	if err := p.PrepareSelectors(context.Background(), []*Claim{ic}); err != nil {
		t.Fatal(err)
	}
	for _, n := range pc.inv.All() {
		if !memoised(n) {
			t.Errorf("node %s: not evaluated after the inventory changed", n.Node)
		}
	}
}
