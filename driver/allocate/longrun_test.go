package allocate

import (
	"reflect"
	"testing"
)

// TestLongRunKeepsMeshPairs is the decision that criterion 3d exists for:
// on the DGX-1's hybrid cube mesh with GPU 0 busy, a pair is asked for.
// 1-2 and 2-3 are both NV2 and tie on everything the free GPUs show;
// 1-2 leaves 3, whose NV2 partner is GPU 0, so 0-3 is an NV2 pair again
// once 0's job ends, where 2-3 would leave 1, whose NV2 links lead into
// the other quad. On NVSwitch nodes the criterion has nothing to weigh.
func TestLongRunKeepsMeshPairs(t *testing.T) {
	mix := mustSizeMix(map[int]float64{1: 1, 2: 2, 4: 1})
	node := nodeWith("node-a", dgx1V100(t), 0)
	r, err := Allocate(node, Request{GPUs: 2}, Policy{Mix: mix})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 2}; !reflect.DeepEqual(r.GPUs, want) {
		t.Fatalf("took %v, want %v", r.GPUs, want)
	}
	if lt := longRunFor(dgxA100(t)); lt != nil {
		t.Fatalf("DGX A100: long-run table %+v, want none", lt)
	}
	lt := longRunFor(dgx1V100(t))
	if lt == nil || len(lt.sets[2]) != 8 || len(lt.sets[4]) != 2 {
		t.Fatalf("DGX-1 V100: want the 8 NV2 pairs and the 2 NVLink quads, got %+v", lt)
	}
}
