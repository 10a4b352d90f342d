package planner

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestUpsertSameVersionKeepsNode: the informer's periodic resync hands
// back the slice version stored, which must not replace the node's
// inventory (its memos and every kept score of it would go, on every node
// at once); a new version does.
func TestUpsertSameVersionKeepsNode(t *testing.T) {
	topo, err := controllertest.ParseFixture("dgx-a100.txt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice("a", topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.UID, s.ResourceVersion = types.UID("slice-a"), "5"
	inv := NewInventory()
	if err := inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	first, gen := inv.Node("a"), inv.Generation()
	if first == nil {
		t.Fatal("node a has no inventory")
	}
	if err := inv.Upsert(s.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if inv.Node("a") != first || inv.Generation() != gen {
		t.Fatal("the same slice version replaced the node's inventory")
	}
	// The ResourceSlice tracker applies a DeviceTaintRule to the slice it
	// hands out without changing its version: the taint must be seen.
	tainted := s.DeepCopy()
	tainted.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "example.com/broken", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if err := inv.Upsert(tainted); err != nil {
		t.Fatal(err)
	}
	if inv.Node("a") == first || inv.Generation() == gen {
		t.Fatal("a DeviceTaintRule's taint on the same slice version kept the node's old inventory")
	}
	first, gen = inv.Node("a"), inv.Generation()
	next := tainted.DeepCopy()
	next.ResourceVersion = "6"
	if err := inv.Upsert(next); err != nil {
		t.Fatal(err)
	}
	if inv.Node("a") == first || inv.Generation() == gen {
		t.Fatal("a new slice version kept the node's old inventory")
	}
}
