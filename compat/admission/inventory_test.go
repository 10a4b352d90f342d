package admission

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
)

func slice(name, drv string, mem ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.ResourceSliceSpec{Driver: drv}}
	for _, m := range mem {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: "gpu", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			driver.CapacityMemory: {Value: resource.MustParse(m)},
		}})
	}
	return s
}

func TestInventorySizes(t *testing.T) {
	inv := &Inventory{slice: map[string][]int64{}}
	inv.set(slice("a", driver.Name, "40Gi", "40Gi"))
	inv.set(slice("b", driver.Name, "80Gi", "32Gi"))
	inv.set(slice("c", "other.example.com", "1Ti"))
	// A MIG device's memory is no GPU's.
	withMIG := slice("d", driver.Name, "80Gi")
	withMIG.Spec.Devices = append(withMIG.Spec.Devices, resourceapi.Device{Name: driver.MIGDeviceName(1, 0, 0), Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		driver.CapacityMemory: {Value: resource.MustParse("4864Mi")},
	}})
	inv.set(withMIG)
	if got, want := inv.MemorySizes(), []int64{32 << 30, 40 << 30, 80 << 30}; !slices.Equal(got, want) {
		t.Errorf("sizes %v, want %v", got, want)
	}
	inv.update("b", nil)
	inv.update("d", nil)
	if got := inv.MemorySizes(); !slices.Equal(got, []int64{40 << 30}) {
		t.Errorf("after deleting b: %v", got)
	}
}

func TestAnnouncerOncePerPod(t *testing.T) {
	rec := events.NewFakeRecorder(10)
	a := &Announcer{rec: rec, seen: map[types.UID]bool{}}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u1",
		Labels:      map[string]string{compat.LabelManaged: "true"},
		Annotations: map[string]string{compat.AnnotationTranslated: "container main: nvidia.com/gpu: 2 -> claim gpulink-main"}}}
	a.pod(p)
	a.pod(p)
	a.pod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "q", UID: "u2"}})
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want 1", len(rec.Events))
	}
	if e := <-rec.Events; e != "Normal GPUResourcesTranslated translated: container main: nvidia.com/gpu: 2 -> claim gpulink-main" {
		t.Errorf("event %q", e)
	}
}
