package planner

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// idleNode publishes pool "n" (controllertest's results name it) with the
// four GPUs of pcie-4, the device taints given by device index.
func idleNode(t *testing.T, taints map[int]resourceapi.DeviceTaint) *NodeInventory {
	t.Helper()
	topo, err := topology.ParseFile("../../driver/topology/testdata/pcie-4.txt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice("n", topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, taint := range taints {
		s.Spec.Devices[i].Taints = append(s.Spec.Devices[i].Taints, taint)
	}
	inv := NewInventory()
	if err := inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	n := inv.Node("n")
	if n == nil || len(n.Devices) != 4 {
		t.Fatalf("node n: %+v, want 4 GPUs", n)
	}
	return n
}

func TestHasIdleGPU(t *testing.T) {
	unhealthy := resourceapi.DeviceTaint{Key: "gpu.gpulink.dev/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	for _, tc := range []struct {
		name    string
		taints  map[int]resourceapi.DeviceTaint
		results []resourceapi.DeviceRequestAllocationResult
		want    bool
	}{
		{name: "idle node", want: true},
		{name: "three of four given out", want: true, results: []resourceapi.DeviceRequestAllocationResult{
			controllertest.WholeResult("gpu-0"), controllertest.WholeResult("gpu-1"), controllertest.WholeResult("gpu-2")}},
		{name: "all given out", results: []resourceapi.DeviceRequestAllocationResult{
			controllertest.WholeResult("gpu-0"), controllertest.WholeResult("gpu-1"), controllertest.WholeResult("gpu-2"), controllertest.WholeResult("gpu-3")}},
		// A GPU that holds a share is not idle: its rest is for shares.
		{name: "three given out, the fourth shared", results: []resourceapi.DeviceRequestAllocationResult{
			controllertest.WholeResult("gpu-0"), controllertest.WholeResult("gpu-1"), controllertest.WholeResult("gpu-2"),
			controllertest.ShareResult("gpu-3", "4Gi", "25")}},
		// An unhealthy GPU cannot be allocated: nothing to keep free.
		{name: "three given out, the fourth tainted unhealthy", taints: map[int]resourceapi.DeviceTaint{3: unhealthy},
			results: []resourceapi.DeviceRequestAllocationResult{
				controllertest.WholeResult("gpu-0"), controllertest.WholeResult("gpu-1"), controllertest.WholeResult("gpu-2")}},
		{name: "one tainted unhealthy, the others free", taints: map[int]resourceapi.DeviceTaint{3: unhealthy}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := idleNode(t, tc.taints)
			l := NewLedger()
			var changed []string
			l.OnPoolChange(func(pool string) { changed = append(changed, pool) })
			if len(tc.results) > 0 {
				l.Observe(controllertest.ClaimWith("c", "1", tc.results...))
				// Once per pool and change: the claim's devices are on one node.
				if len(changed) != 1 || changed[0] != "n" {
					t.Errorf("pools told of the change: %q, want n once", changed)
				}
			}
			if got := l.HasIdleGPU(n); got != tc.want {
				t.Errorf("HasIdleGPU = %v, want %v", got, tc.want)
			}
			if len(tc.results) > 0 {
				l.Forget("c")
				if !l.HasIdleGPU(n) && tc.taints == nil {
					t.Error("no idle GPU once the claim is gone")
				}
			}
		})
	}
	if NewLedger().HasIdleGPU(nil) {
		t.Error("a node without inventory has an idle GPU")
	}
}

// A GPU in MIG mode is idle while none of its MIG devices is held.
func TestHasIdleGPUMIG(t *testing.T) {
	// Every GPU of the DGX A100 in MIG mode, two 3g.20gb devices each.
	layout := map[int][]string{}
	for g := range 8 {
		layout[g] = []string{"3g.20gb", "3g.20gb"}
	}
	inv := NewInventory()
	if err := inv.Upsert(controllertest.MIGSlice(t, "a100", layout)); err != nil {
		t.Fatal(err)
	}
	n := inv.Node("a100")
	if n == nil || len(n.Devices) != 0 || len(n.MIG) != 16 {
		t.Fatalf("node a100: %d whole GPUs, %d MIG devices; want 0 and 16", len(n.Devices), len(n.MIG))
	}
	l := NewLedger()
	if !l.HasIdleGPU(n) {
		t.Fatal("no idle GPU on an idle node in MIG mode")
	}
	// One device of each GPU held: no GPU is idle, though half of every
	// GPU is free.
	var results []resourceapi.DeviceRequestAllocationResult
	byParent := map[int]bool{}
	for _, d := range n.MIG {
		if !byParent[d.Parent] {
			byParent[d.Parent] = true
			results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver.Name, Pool: "a100", Device: d.Name})
		}
	}
	l.Observe(controllertest.ClaimWith("c", "1", results...))
	if l.HasIdleGPU(n) {
		t.Error("an idle GPU while every GPU in MIG mode holds a device")
	}
	l.Observe(controllertest.ClaimWith("c", "2", results[1:]...))
	if !l.HasIdleGPU(n) {
		t.Error("no idle GPU once the devices of one GPU are all free")
	}
}
