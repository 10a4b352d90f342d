package planner

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestShareConsSharedAcrossNodes checks that the GPUs of two nodes of one
// kind share one memoised consumption per share shape, that GPUs with
// other capacities (80Gi instead of 32Gi) get their own, and that each is
// what shareConsumption computes for the device itself.
func TestShareConsSharedAcrossNodes(t *testing.T) {
	inv := NewInventory()
	v100, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	other, err := controllertest.Slice("other", v100, controllertest.SliceOptions{MemoryBytes: 80 << 30})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*resourceapi.ResourceSlice{controllertest.V100Slice(t, "a"), controllertest.V100Slice(t, "b"), other} {
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c := inv.Node("a"), inv.Node("b"), inv.Node("other")
	q := resource.MustParse("3Gi")
	alt := &Alternative{ResultName: "r", Share: true, ConfigMemory: &q}
	alt.shareSig = shareSignature(alt)

	for pos := range a.Devices {
		sa, sb, sc := a.shareCons(alt, pos), b.shareCons(alt, pos), c.shareCons(alt, pos)
		if sa != sb {
			t.Errorf("GPU %d: two V100 nodes hold two consumptions of one share", pos)
		}
		if sa == sc {
			t.Errorf("GPU %d: GPUs of 32Gi and 80Gi share one consumption", pos)
		}
		for name, got := range map[string]*shareCons{"a": sa, "other": sc} {
			n := inv.Node(name)
			want := newShareCons(n.Devices[pos], alt)
			if got.err != nil || want.err != nil {
				t.Fatalf("node %s GPU %d: %v / %v", name, pos, got.err, want.err)
			}
			if *got.share != *want.share || got.key != want.key || !equality.Semantic.DeepEqual(got.consumed, want.consumed) {
				t.Errorf("node %s GPU %d: memoised %+v %q %v, computed %+v %q %v", name, pos,
					*got.share, got.key, got.consumed, *want.share, want.key, want.consumed)
			}
		}
	}
	if got := sharedConsumptionsLen(); got > shareConsEntries {
		t.Errorf("shared consumption memo holds %d entries, want at most %d", got, shareConsEntries)
	}
}

func sharedConsumptionsLen() int {
	sharedConsumptions.Lock()
	defer sharedConsumptions.Unlock()
	return sharedConsumptions.lru.len()
}
