package discovery

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// gb200Fabric is the fabric info of a GPU registered in clique 7 of
// cluster 2b5a37d2-0bd5-4ad3-9c1e-7d2f3e4a5b60.
var gb200Fabric = nvml.GpuFabricInfo{
	ClusterUuid: [16]uint8{0x2b, 0x5a, 0x37, 0xd2, 0x0b, 0xd5, 0x4a, 0xd3, 0x9c, 0x1e, 0x7d, 0x2f, 0x3e, 0x4a, 0x5b, 0x60},
	CliqueId:    7,
	State:       nvml.GPU_FABRIC_STATE_COMPLETED,
	Status:      uint32(nvml.SUCCESS),
}

const gb200Clique = "2b5a37d2-0bd5-4ad3-9c1e-7d2f3e4a5b60.7"

// A GPU is in a clique only when NVML reports its fabric registration
// completed with success: GPUs without a fabric (NOT_SUPPORTED), drivers
// without the call (FUNCTION_NOT_FOUND), registrations not started, in
// progress or failed give no clique and no error; any other failure of
// the call fails discovery naming the GPU and the call.
func TestNVMLClique(t *testing.T) {
	box := fakeBox{
		gpus:     []fakeGPU{{busID: "00000000:0A:00.0"}, {busID: "00000000:0B:00.0"}},
		ancestor: func(i, j int) nvml.GpuTopologyLevel { return sys },
	}
	sysRoot := fakeSysfs(
		sysDevice{busID: "0000:0a:00.0", root: "pci0000:00", numa: "0\n"},
		sysDevice{busID: "0000:0b:00.0", root: "pci0000:00", numa: "0\n"},
	)
	with := func(info nvml.GpuFabricInfo, ret nvml.Return) func() (nvml.GpuFabricInfo, nvml.Return) {
		return func() (nvml.GpuFabricInfo, nvml.Return) { return info, ret }
	}
	state := func(s uint8) nvml.GpuFabricInfo { i := gb200Fabric; i.State = s; return i }
	failed := gb200Fabric
	failed.Status = uint32(nvml.ERROR_UNKNOWN)
	tests := []struct {
		name    string
		fabric  func() (nvml.GpuFabricInfo, nvml.Return)
		want    string
		wantErr nvml.Return
	}{
		{name: "registered", fabric: with(gb200Fabric, nvml.SUCCESS), want: gb200Clique},
		{name: "no fabric", fabric: with(nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED)},
		{name: "driver without the call", fabric: with(nvml.GpuFabricInfo{}, nvml.ERROR_FUNCTION_NOT_FOUND)},
		{name: "fabric state not supported", fabric: with(state(nvml.GPU_FABRIC_STATE_NOT_SUPPORTED), nvml.SUCCESS)},
		{name: "registration not started", fabric: with(state(nvml.GPU_FABRIC_STATE_NOT_STARTED), nvml.SUCCESS)},
		{name: "registration in progress", fabric: with(state(nvml.GPU_FABRIC_STATE_IN_PROGRESS), nvml.SUCCESS)},
		{name: "registration failed", fabric: with(failed, nvml.SUCCESS)},
		{name: "call fails", fabric: with(nvml.GpuFabricInfo{}, nvml.ERROR_UNKNOWN), wantErr: nvml.ERROR_UNKNOWN},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib, devs := box.build()
			devs[1].GetGpuFabricInfoFunc = tc.fabric
			topo, err := newNVML(lib, sysRoot).Discover(context.Background())
			if tc.wantErr != 0 {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Discover: error %v, want %v", err, tc.wantErr)
				}
				if want := "GPU 1: GetGpuFabricInfo"; err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if got := topo.GPUs[0].Clique; got != "" {
				t.Errorf("GPU 0 (no fabric): clique %q, want none", got)
			}
			if got := topo.GPUs[1].Clique; got != tc.want {
				t.Errorf("GPU 1: clique %q, want %q", got, tc.want)
			}
		})
	}
}

// The go-nvml DGX servers have no multi-node fabric; MockOptions.Fabric
// gives every GPU of one a completed registration, as on a GB200 NVL72
// tray, and NVML discovery then finds them all in its clique.
func TestMockFabric(t *testing.T) {
	plain, err := MockTopology("dgxb200", MockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range plain.GPUs {
		if g.Clique != "" {
			t.Errorf("dgxb200 GPU %d: clique %q, want none", g.Index, g.Clique)
		}
	}
	info := gb200Fabric
	topo, err := MockTopology("dgxb200", MockOptions{Fabric: &info})
	if err != nil {
		t.Fatal(err)
	}
	if topo.Len() != 8 {
		t.Fatalf("%d GPUs, want 8", topo.Len())
	}
	for _, g := range topo.GPUs {
		if g.Clique != gb200Clique {
			t.Errorf("GPU %d: clique %q, want %q", g.Index, g.Clique, gb200Clique)
		}
	}
}

func TestCliqueIDFormat(t *testing.T) {
	if got := CliqueID([16]uint8{}, 0); got != "00000000-0000-0000-0000-000000000000.0" {
		t.Errorf("zero: %q", got)
	}
	u := [16]uint8{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if got, want := CliqueID(u, 4294967295), "ffffffff-ffff-ffff-ffff-ffffffffffff.4294967295"; got != want {
		t.Errorf("max: %q, want %q", got, want)
	}
}
