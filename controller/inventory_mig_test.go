package controller

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
)

// migSlice is the slice of a simulated DGX A100 (40GB) with a MIG layout.
func TestInventoryKeepsMIGDevicesApart(t *testing.T) {
	inv := planner.NewInventory()
	if err := inv.Upsert(controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb", "3g.20gb"}, 1: {"7g.40gb"}})); err != nil {
		t.Fatal(err)
	}
	n := inv.Node("a100")
	if n == nil || n.Topo.Len() != 6 {
		t.Fatalf("node inventory %+v, want the 6 GPUs not in MIG mode", n)
	}
	for _, d := range n.Devices {
		if d.Index == 0 || d.Index == 1 {
			t.Errorf("GPU %d is in MIG mode but counted as a whole GPU", d.Index)
		}
	}
	want := map[string]struct {
		parent  int
		profile string
		pl      mig.Placement
	}{
		"gpu-0-mig-0-0": {0, "1g.5gb", mig.Placement{Start: 0, Size: 1}},
		"gpu-0-mig-1-0": {0, "3g.20gb", mig.Placement{Start: 4, Size: 4}},
		"gpu-1-mig-0-0": {1, "7g.40gb", mig.Placement{Start: 0, Size: 8}},
	}
	if len(n.MIG) != len(want) {
		t.Fatalf("%d MIG devices, want %d", len(n.MIG), len(want))
	}
	for _, m := range n.MIG {
		w, ok := want[m.Name]
		if !ok || m.Parent != w.parent || m.Profile != w.profile || m.Placement != w.pl || m.MemoryBytes <= 0 {
			t.Errorf("MIG device %+v, want %+v", m, w)
		}
	}

	all := controllertest.MIGSlice(t, "all", map[int][]string{0: {"7g.40gb"}, 1: {"7g.40gb"}, 2: {"7g.40gb"}, 3: {"7g.40gb"}, 4: {"7g.40gb"}, 5: {"7g.40gb"}, 6: {"7g.40gb"}, 7: {"7g.40gb"}})
	if err := inv.Upsert(all); err != nil {
		t.Fatalf("a node whose GPUs are all in MIG mode: %v", err)
	}
	if n := inv.Node("all"); n == nil || n.Topo.Len() != 0 || len(n.MIG) != 8 {
		t.Fatalf("all-MIG node %+v, want no whole GPU and 8 MIG devices", n)
	}
}

func TestInventoryRejectsBadMIGDevices(t *testing.T) {
	for _, c := range []struct {
		edit func(*resourceapi.ResourceSlice)
		want string
	}{{
		edit: func(s *resourceapi.ResourceSlice) {
			for i := range s.Spec.Devices {
				if s.Spec.Devices[i].Name == "gpu-0-mig-0-0" {
					s.Spec.Devices[i].Name = "gpu-2-mig-0-0"
				}
			}
		},
		want: "parentIndex must be the int 2",
	}, {
		edit: func(s *resourceapi.ResourceSlice) {
			// gpu-2 is whole; a MIG device of it contradicts that.
			for i := range s.Spec.Devices {
				d := &s.Spec.Devices[i]
				if d.Name == "gpu-0-mig-0-0" {
					d.Name = "gpu-2-mig-0-0"
					v := int64(2)
					d.Attributes[driver.AttrParentIndex] = resourceapi.DeviceAttribute{IntValue: &v}
				}
			}
		},
		want: "also published whole",
	}} {
		s := controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb"}})
		c.edit(s)
		err := planner.NewInventory().Upsert(s)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error containing %q", err, c.want)
		}
	}
}

// A whole-GPU claim never gets a GPU in MIG mode, nor any of its MIG devices.
func TestWholeGPUClaimSkipsMIGGPUs(t *testing.T) {
	layout := map[int][]string{}
	for i := range 7 {
		layout[i] = []string{"7g.40gb"}
	}
	h := newHarness(t, objs(classes(), []runtime.Object{controllertest.Node("a100"), controllertest.MIGSlice(t, "a100", layout)})...).start()
	h.claim("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}})
	h.pod("p1", true, "one")
	c := h.waitAllocated("one")
	if got := devicesOf(c); len(got) != 1 || got[0] != "gpu-7" {
		t.Errorf("whole GPU claim got %v, want gpu-7, the only GPU not in MIG mode", got)
	}
	h.claim("two", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}})
	h.pod("p2", true, "two")
	h.waitEvent(ns+"/p2", report.ReasonWaiting)
	if a := h.getClaim("two").Status.Allocation; a != nil {
		t.Errorf("second whole GPU claim allocated %+v on a node with one GPU not in MIG mode", a.Devices.Results)
	}
}

// The whole-GPU class never selects a MIG device; the share class neither
// (MIG devices do not allow multiple allocations); the MIG class selects
// MIG devices only.
func TestShippedClassesLeaveOutMIGDevices(t *testing.T) {
	s := controllertest.MIGSlice(t, "a100", map[int][]string{0: {"1g.5gb"}})
	compiler := dracel.GetCompiler(dracel.Features{})
	for _, c := range planner.DeviceClasses() {
		expr := c.Spec.Selectors[0].CEL.Expression
		prog := compiler.CompileCELExpression(expr, dracel.Options{})
		if prog.Error != nil {
			t.Fatalf("class %s: %v", c.Name, prog.Error)
		}
		for _, d := range s.Spec.Devices {
			match, _, err := prog.DeviceMatches(context.Background(), dracel.Device{Driver: driver.Name, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
			if err != nil {
				t.Fatalf("class %s on %s: %v", c.Name, d.Name, err)
			}
			want := !driver.IsMIGDeviceName(d.Name)
			if planner.IsMIGClass(c) {
				want = !want
			}
			if match != want {
				t.Errorf("class %s selects %s: %v, want %v", c.Name, d.Name, match, want)
			}
		}
	}
}
