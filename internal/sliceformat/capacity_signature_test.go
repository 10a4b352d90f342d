package sliceformat

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/driver"
)

// shareCapacities are the capacities a shareable GPU of memBytes
// publishes, with the given default share.
func shareCapacities(memBytes, defMem int64) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		driver.CapacityMemory: {
			Value: *resource.NewQuantity(memBytes, resource.BinarySI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(defMem, resource.BinarySI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(MemoryStep, resource.BinarySI),
					Max:  resource.NewQuantity(memBytes, resource.BinarySI),
					Step: resource.NewQuantity(MemoryStep, resource.BinarySI),
				},
			},
		},
		driver.CapacityCores: {Value: *resource.NewQuantity(CoresTotal, resource.DecimalSI)},
	}
}

func TestCapacitySignature(t *testing.T) {
	sig := func(caps map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) string {
		t.Helper()
		s, ok := CapacitySignature(caps)
		if !ok {
			t.Fatalf("capacities %v have no signature", caps)
		}
		return s
	}
	base := sig(shareCapacities(80*gib, 16*gib))
	if again := sig(shareCapacities(80*gib, 16*gib)); again != base {
		t.Fatalf("equal capacities built twice sign differently: %q and %q", base, again)
	}
	renamed := shareCapacities(80*gib, 16*gib)
	renamed["example.com/"+driver.CapacityCores] = renamed[driver.CapacityCores]
	delete(renamed, driver.CapacityCores)
	noPolicy := shareCapacities(80*gib, 16*gib)
	c := noPolicy[driver.CapacityMemory]
	c.RequestPolicy = nil
	noPolicy[driver.CapacityMemory] = c
	for name, other := range map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"another memory size":   shareCapacities(40*gib, 16*gib),
		"another default share": shareCapacities(80*gib, 8*gib),
		"another capacity name": renamed,
		"no request policy":     noPolicy,
		"one capacity fewer":    {driver.CapacityMemory: shareCapacities(80*gib, 16*gib)[driver.CapacityMemory]},
		"no capacities":         {},
	} {
		if sig(other) == base {
			t.Errorf("%s: signs as the base capacities do", name)
		}
	}
	// A quantity's unit is part of what it renders: the same bytes in
	// another unit is another signature, never a wrong match.
	bin := sig(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{driver.CapacityMemory: {Value: *resource.NewQuantity(80*gib, resource.BinarySI)}})
	dec := sig(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{driver.CapacityMemory: {Value: *resource.NewQuantity(80*gib, resource.DecimalSI)}})
	if bin == dec {
		t.Errorf("80Gi in binary and decimal units sign alike (%q)", bin)
	}
}
