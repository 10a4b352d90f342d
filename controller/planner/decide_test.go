package planner

import (
	"strings"
	"testing"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// With several unusable pools and no usable node, the waiting message
// names the same pool every time: the explainer records a message once
// only while it repeats exactly.
func TestWaitingMessageStableWithUnusablePools(t *testing.T) {
	inv := NewInventory()
	p, err := New(Config{Inventory: inv, Ledger: NewLedger(), Filter: &NodeFilter{}, Selectors: NewSelectorEvaluator()})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"c", "a", "d", "b"} {
		s := controllertest.V100Slice(t, node)
		s.Spec.Pool.ResourceSliceCount = 2
		if err := inv.Upsert(s); err == nil {
			t.Fatalf("incomplete pool %s accepted", node)
		}
	}
	first := p.WaitingMessage(nil, Decision{})
	if !strings.Contains(first, "pool a unusable") {
		t.Errorf("message %q does not name pool a, the first by name", first)
	}
	for range 50 {
		if msg := p.WaitingMessage(nil, Decision{}); msg != first {
			t.Fatalf("waiting message changed between calls:\n%s\n%s", first, msg)
		}
	}
}
