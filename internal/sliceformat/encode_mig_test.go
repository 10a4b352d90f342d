package sliceformat

import (
	"testing"

	"github.com/gpulink/gpulink/driver/topology/topologytest"

	"github.com/gpulink/gpulink/driver"
)

func TestEncodeMIG(t *testing.T) {
	topo := topologytest.MIG(t, map[int][]string{0: {"1g.5gb", "3g.20gb"}, 1: {"7g.40gb"}})
	devs := buildOne(t, topo, defaultOptions())
	byName := map[string]int{}
	for i, d := range devs {
		byName[d.Name] = i
	}
	for _, name := range []string{"gpu-0", "gpu-1"} {
		if _, ok := byName[name]; ok {
			t.Errorf("GPU in MIG mode published whole as %s", name)
		}
	}
	for i := 2; i < 8; i++ {
		name := driver.DeviceName(i)
		k, ok := byName[name]
		if !ok {
			t.Fatalf("whole GPU %s missing; devices %v", name, byName)
		}
		d := devs[k]
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s: not shareable", name)
		}
		// The MIG GPUs are not on the node as far as whole GPUs go.
		if row := *attr(t, d, driver.AttrLinks).StringValue; row[0] != '.' || row[1] != '.' {
			t.Errorf("%s: links row %q offers the MIG GPUs 0 and 1", name, row)
		}
		if _, ok := d.Attributes[driver.AttrMIGProfile]; ok {
			t.Errorf("%s: whole GPU has a MIG profile", name)
		}
	}
	parent0 := topo.GPUs[0]
	for _, c := range []struct {
		name, profile       string
		parent, start, size int64
		sms                 int64
		memory              string
	}{
		{"gpu-0-mig-0-0", "1g.5gb", 0, 0, 1, 14, "4864Mi"},
		{"gpu-0-mig-1-0", "3g.20gb", 0, 4, 4, 42, "19968Mi"},
		{"gpu-1-mig-0-0", "7g.40gb", 1, 0, 8, 98, "40192Mi"},
	} {
		k, ok := byName[c.name]
		if !ok {
			t.Fatalf("MIG device %s missing; devices %v", c.name, byName)
		}
		d := devs[k]
		if got := *attr(t, d, driver.AttrMIGProfile).StringValue; got != c.profile {
			t.Errorf("%s: profile %q, want %q", c.name, got, c.profile)
		}
		if got := *attr(t, d, driver.AttrType).StringValue; got != driver.DeviceTypeMIG {
			t.Errorf("%s: type %q", c.name, got)
		}
		for name, want := range map[string]int64{
			driver.AttrParentIndex: c.parent, driver.AttrPlacementStart: c.start,
			driver.AttrPlacementSize: c.size, driver.AttrMultiprocessors: c.sms,
		} {
			if got := attr(t, d, name).IntValue; got == nil || *got != want {
				t.Errorf("%s: %s = %v, want %d", c.name, name, got, want)
			}
		}
		if q := d.Capacity[driver.CapacityMemory].Value; q.String() != c.memory {
			got := q.String()
			t.Errorf("%s: memory %s, want %s", c.name, got, c.memory)
		}
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			t.Errorf("%s: a MIG device must be exclusive", c.name)
		}
		if len(d.Taints) != 1 || d.Taints[0].Key != driver.ManagedTaintKey {
			t.Errorf("%s: taints %v, want the managed taint", c.name, d.Taints)
		}
		uuid := *attr(t, d, driver.AttrUUID).StringValue
		if uuid == parent0.UUID || uuid[:4] != "MIG-" {
			t.Errorf("%s: uuid %q, want the MIG device's own", c.name, uuid)
		}
		if _, ok := d.Attributes[driver.AttrIndex]; ok {
			t.Errorf("%s: a MIG device must not claim a GPU index", c.name)
		}
	}
	if got := *attr(t, devs[byName["gpu-0-mig-1-0"]], driver.AttrParentUUID).StringValue; got != parent0.UUID {
		t.Errorf("parentUUID %q, want %q", got, parent0.UUID)
	}
	if len(devs) != 6+3 {
		t.Errorf("%d devices, want 6 whole GPUs and 3 MIG devices", len(devs))
	}
}

// A node whose GPUs are all in MIG mode publishes MIG devices only; one in
// MIG mode without instances publishes nothing for that GPU.
func TestEncodeAllMIG(t *testing.T) {
	layout := map[int][]string{}
	for i := range 8 {
		layout[i] = []string{"4g.20gb", "3g.20gb"}
	}
	layout[7] = nil
	devs := buildOne(t, topologytest.MIG(t, layout), defaultOptions())
	if len(devs) != 14 {
		t.Fatalf("%d devices, want 14 MIG devices", len(devs))
	}
	for _, d := range devs {
		if !driver.IsMIGDeviceName(d.Name) {
			t.Errorf("device %s is not a MIG device", d.Name)
		}
	}
}
