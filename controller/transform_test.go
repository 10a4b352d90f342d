package controller

import (
	"reflect"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
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
	// Both nodes' GPUs publish the same capacities: one map holds them.
	a, b := out[0].Spec.Devices[1].Capacity, out[1].Spec.Devices[1].Capacity
	if len(a) == 0 {
		t.Fatal("device 1 publishes no capacity to compare")
	}
	if mapData(a) != mapData(b) {
		t.Error("two nodes' identical GPU capacities are held as two maps")
	}
}

// TestInternCapacityKeepsDistinctCapacities checks that capacities that
// differ in a value or a request policy keep maps of their own, with
// their own values, and that equal ones built apart share one.
func TestInternCapacityKeepsDistinctCapacities(t *testing.T) {
	build := func(mem string, step string) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
		q := resource.MustParse(step)
		return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: resource.MustParse(mem), RequestPolicy: &resourceapi.CapacityRequestPolicy{
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &q, Step: &q},
			}},
		}
	}
	first := internCapacity(build("80Gi", "256Mi"))
	again := internCapacity(build("80Gi", "256Mi"))
	if mapData(first) != mapData(again) {
		t.Error("equal capacities built apart are held as two maps")
	}
	for _, other := range []struct{ mem, step string }{{"40Gi", "256Mi"}, {"80Gi", "1Gi"}} {
		want := build(other.mem, other.step)
		got := internCapacity(build(other.mem, other.step))
		if mapData(got) == mapData(first) {
			t.Errorf("memory %s step %s: shares the map of memory 80Gi step 256Mi", other.mem, other.step)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("memory %s step %s: interned capacities %v differ from %v", other.mem, other.step, got, want)
		}
	}
}

// mapData is where a map's table lives: two map values with the same
// are one map.
func mapData(m map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) unsafe.Pointer {
	return reflect.ValueOf(m).UnsafePointer()
}

func unsafeStringData(s string) *byte { return unsafe.StringData(s) }
