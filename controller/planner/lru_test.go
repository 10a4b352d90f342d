package planner

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// TestNodeMemosAreBounded: gated pods with ever new selectors or share
// sizes must not grow the per-node caches without limit.
func TestNodeMemosAreBounded(t *testing.T) {
	const bound = memoEntriesPerNode
	inv := NewInventory()
	if err := inv.Upsert(controllertest.V100Slice(t, "n")); err != nil {
		t.Fatal(err)
	}
	n := inv.Node("n")
	sel := NewSelectorEvaluator()
	ctx := context.Background()
	for i := range 3 * bound {
		expr := fmt.Sprintf(`device.attributes["%s"].index != %d`, driver.Name, 1000+i)
		row, err := sel.matchesOnNode(ctx, n, expr)
		if err != nil {
			t.Fatal(err)
		}
		if !row[0].match {
			t.Fatalf("selector %q does not match device 0", expr)
		}
		alt := &Alternative{ResultName: "r", Share: true, Capacity: nil}
		q := resource.MustParse(fmt.Sprintf("%dMi", 100+i))
		alt.ConfigMemory = &q
		alt.shareSig = shareSignature(alt)
		if sc := n.shareCons(alt, 0); sc.err != nil || sc.share.MemoryBytes < q.Value() {
			t.Fatalf("share of %s: %+v", q.String(), sc)
		}
	}
	if got := n.memoLen(); got > bound {
		t.Errorf("selector memo holds %d entries, want at most %d", got, bound)
	}
	if got := n.shareMemoLen(); got > bound {
		t.Errorf("share memo holds %d entries, want at most %d", got, bound)
	}
	// The most recent entries are still cached (same row returned).
	last := fmt.Sprintf(`device.attributes["%s"].index != %d`, driver.Name, 1000+3*bound-1)
	a, _ := sel.matchesOnNode(ctx, n, last)
	b, _ := sel.matchesOnNode(ctx, n, last)
	if &a[0] != &b[0] {
		t.Error("most recent selector result was not cached")
	}
}

func (n *NodeInventory) memoLen() int {
	n.memoMu.Lock()
	defer n.memoMu.Unlock()
	return n.memo.len()
}

func (n *NodeInventory) shareMemoLen() int {
	n.memoMu.Lock()
	defer n.memoMu.Unlock()
	return n.shareMemo.len()
}
