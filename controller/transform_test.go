package controller

import (
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestTransformKeepsSliceValues checks that the informers' transform
// changes nothing a reader sees in a ResourceSlice but managedFields, and
// that two nodes of one kind then share their repeated strings.
func TestTransformKeepsSliceValues(t *testing.T) {
	var out []*resourceapi.ResourceSlice
	for _, node := range []string{"a", "b"} {
		topo, err := controllertest.ParseFixture("dgx1-v100.txt")
		if err != nil {
			t.Fatal(err)
		}
		s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "k", Value: "v", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "plugin"}}
		want := s.DeepCopy()
		want.ManagedFields = nil
		got, err := transformObject(s)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Fatalf("node %s: transformed slice differs from the original", node)
		}
		out = append(out, got.(*resourceapi.ResourceSlice))
	}
	shared := 0
	for k, a := range out[0].Spec.Devices[1].Attributes {
		b, ok := out[1].Spec.Devices[1].Attributes[k]
		if !ok || a.StringValue == nil || b.StringValue == nil || *a.StringValue != *b.StringValue {
			continue
		}
		if a.StringValue == b.StringValue {
			t.Fatalf("attribute %s: both slices share one pointer; each value must keep its own", k)
		}
		if unsafeStringData(*a.StringValue) != unsafeStringData(*b.StringValue) {
			t.Errorf("attribute %s=%q is stored twice", k, *a.StringValue)
		}
		shared++
	}
	if shared == 0 {
		t.Fatal("no string attribute to compare")
	}
}

func unsafeStringData(s string) *byte { return unsafe.StringData(s) }
