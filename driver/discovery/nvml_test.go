package discovery

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpulink/gpulink/driver/topology"
)

// matrix renders a topology's links as nvidia-smi rows, "X" on the diagonal.
func matrix(t *topology.Topology) []string {
	rows := make([]string, t.Len())
	for i := range t.Len() {
		cells := make([]string, t.Len())
		for j := range t.Len() {
			if i == j {
				cells[j] = "X"
				continue
			}
			cells[j] = t.Link(i, j).String()
		}
		rows[i] = strings.Join(cells, " ")
	}
	return rows
}

func sameRows(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d rows, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: got %q, want %q", i, got[i], want[i])
		}
	}
}

// levels builds an ancestor function from a symmetric table.
func levels(table [][]nvml.GpuTopologyLevel) func(i, j int) nvml.GpuTopologyLevel {
	return func(i, j int) nvml.GpuTopologyLevel { return table[i][j] }
}

const (
	pix  = nvml.TOPOLOGY_SINGLE
	pxb  = nvml.TOPOLOGY_MULTIPLE
	phb  = nvml.TOPOLOGY_HOSTBRIDGE
	node = nvml.TOPOLOGY_NODE
	sys  = nvml.TOPOLOGY_SYSTEM
	self = nvml.TOPOLOGY_INTERNAL
)

// bridgeBox is a 6-GPU PCIe workstation-class box: GPU0/1 and GPU2/3 are
// joined by 4-lane NVLink bridges and sit on one switch each, GPU4/5 have
// no bridge and share a two-level switch, GPU0-3 are on socket 0.
func bridgeBox() fakeBox {
	return fakeBox{
		gpus: []fakeGPU{
			{busID: nvBus(0x1a), links: gpuLinks(0x1b, 4)},
			{busID: nvBus(0x1b), links: gpuLinks(0x1a, 4)},
			{busID: nvBus(0x3d), links: gpuLinks(0x3e, 4)},
			{busID: nvBus(0x3e), links: gpuLinks(0x3d, 4)},
			{busID: nvBus(0x88)},
			{busID: nvBus(0x89)},
		},
		ancestor: levels([][]nvml.GpuTopologyLevel{
			{self, pix, phb, phb, sys, sys},
			{pix, self, phb, phb, sys, sys},
			{phb, phb, self, pix, sys, sys},
			{phb, phb, pix, self, sys, sys},
			{sys, sys, sys, sys, self, pxb},
			{sys, sys, sys, sys, pxb, self},
		}),
	}
}

// switchBox is a 4-GPU box whose links all end at NVSwitches.
func switchBox(lanes []int, kind nvml.IntNvLinkDeviceType) fakeBox {
	b := fakeBox{ancestor: func(i, j int) nvml.GpuTopologyLevel {
		if i/2 == j/2 {
			return pxb
		}
		return sys
	}}
	for i, n := range lanes {
		b.gpus = append(b.gpus, fakeGPU{
			busID: nvBus(0x10 * (i + 1)),
			links: repeatLinks(fakeLink{remote: nvBus(0xc0 + i%2), kind: kind}, n),
		})
	}
	return b
}

func TestNVMLLinks(t *testing.T) {
	tests := []struct {
		name   string
		box    fakeBox
		mutate func(devs []*mock.Device)
		want   []string
	}{{
		name: "PCIe box with NVLink bridge pairs",
		box:  bridgeBox(),
		want: []string{
			"X NV4 PHB PHB SYS SYS",
			"NV4 X PHB PHB SYS SYS",
			"PHB PHB X NV4 SYS SYS",
			"PHB PHB NV4 X SYS SYS",
			"SYS SYS SYS SYS X PXB",
			"SYS SYS SYS SYS PXB X",
		},
	}, {
		name: "NVLink not supported leaves PCIe classes",
		box:  bridgeBox(),
		mutate: func(devs []*mock.Device) {
			for _, d := range devs {
				d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) {
					return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
				}
			}
		},
		want: []string{
			"X PIX PHB PHB SYS SYS",
			"PIX X PHB PHB SYS SYS",
			"PHB PHB X PIX SYS SYS",
			"PHB PHB PIX X SYS SYS",
			"SYS SYS SYS SYS X PXB",
			"SYS SYS SYS SYS PXB X",
		},
	}, {
		name: "disabled links do not count",
		box:  bridgeBox(),
		mutate: func(devs []*mock.Device) {
			devs[2].GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
				if l >= 4 {
					return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
				}
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
		},
		want: []string{
			"X NV4 PHB PHB SYS SYS",
			"NV4 X PHB PHB SYS SYS",
			"PHB PHB X PIX SYS SYS",
			"PHB PHB PIX X SYS SYS",
			"SYS SYS SYS SYS X PXB",
			"SYS SYS SYS SYS PXB X",
		},
	}, {
		name: "asymmetric lane counts take the smaller",
		box:  bridgeBox(),
		mutate: func(devs []*mock.Device) {
			base := devs[1].GetNvLinkStateFunc
			devs[1].GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
				if l == 3 {
					return nvml.FEATURE_DISABLED, nvml.SUCCESS
				}
				return base(l)
			}
		},
		want: []string{
			"X NV3 PHB PHB SYS SYS",
			"NV3 X PHB PHB SYS SYS",
			"PHB PHB X NV4 SYS SYS",
			"PHB PHB NV4 X SYS SYS",
			"SYS SYS SYS SYS X PXB",
			"SYS SYS SYS SYS PXB X",
		},
	}, {
		name: "NVSwitch: every switch-attached pair gets the switch lanes",
		box:  switchBox([]int{12, 12, 12, 12}, nvml.NVLINK_DEVICE_TYPE_SWITCH),
		want: []string{
			"X NV12 NV12 NV12",
			"NV12 X NV12 NV12",
			"NV12 NV12 X NV12",
			"NV12 NV12 NV12 X",
		},
	}, {
		name: "NVSwitch: thinner attachment limits the pair, unattached GPU uses PCIe",
		box:  switchBox([]int{6, 4, 6, 0}, nvml.NVLINK_DEVICE_TYPE_SWITCH),
		want: []string{
			"X NV4 NV6 SYS",
			"NV4 X NV4 SYS",
			"NV6 NV4 X PXB",
			"SYS SYS PXB X",
		},
	}, {
		name: "unknown remote device with a non-GPU bus ID is an NVSwitch",
		box:  switchBox([]int{6, 6, 6, 6}, nvml.NVLINK_DEVICE_TYPE_UNKNOWN),
		want: []string{
			"X NV6 NV6 NV6",
			"NV6 X NV6 NV6",
			"NV6 NV6 X NV6",
			"NV6 NV6 NV6 X",
		},
	}, {
		name: "remote device type not supported falls back on the bus ID",
		box:  switchBox([]int{2, 2, 2, 2}, nvml.NVLINK_DEVICE_TYPE_GPU),
		mutate: func(devs []*mock.Device) {
			for _, d := range devs {
				d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
					return 0, nvml.ERROR_FUNCTION_NOT_FOUND
				}
			}
		},
		want: []string{
			"X NV2 NV2 NV2",
			"NV2 X NV2 NV2",
			"NV2 NV2 X NV2",
			"NV2 NV2 NV2 X",
		},
	}, {
		name: "links to GPUs this process cannot see are ignored",
		box:  switchBox([]int{2, 2, 2, 2}, nvml.NVLINK_DEVICE_TYPE_GPU),
		want: []string{
			"X PXB SYS SYS",
			"PXB X SYS SYS",
			"SYS SYS X PXB",
			"SYS SYS PXB X",
		},
	}, {
		name: "links to POWER9 CPUs are ignored",
		box:  switchBox([]int{3, 3, 3, 3}, nvml.NVLINK_DEVICE_TYPE_IBMNPU),
		want: []string{
			"X PXB SYS SYS",
			"PXB X SYS SYS",
			"SYS SYS X PXB",
			"SYS SYS PXB X",
		},
	}, {
		name: "loopback links are ignored",
		box: fakeBox{
			gpus: []fakeGPU{
				{busID: nvBus(1), links: append(gpuLinks(1, 2), gpuLinks(2, 1)...)},
				{busID: nvBus(2), links: gpuLinks(1, 1)},
			},
			ancestor: func(i, j int) nvml.GpuTopologyLevel { return phb },
		},
		want: []string{"X NV1", "NV1 X"},
	}, {
		name: "unreadable remote PCI info leaves the lane unclaimed",
		box:  bridgeBox(),
		mutate: func(devs []*mock.Device) {
			for _, d := range devs[:2] {
				d.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
					return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
				}
			}
		},
		want: []string{
			"X PIX PHB PHB SYS SYS",
			"PIX X PHB PHB SYS SYS",
			"PHB PHB X NV4 SYS SYS",
			"PHB PHB NV4 X SYS SYS",
			"SYS SYS SYS SYS X PXB",
			"SYS SYS SYS SYS PXB X",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib, devs := tc.box.build()
			if tc.mutate != nil {
				tc.mutate(devs)
			}
			topo, err := newNVML(lib, fstest.MapFS{}).Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			sameRows(t, matrix(topo), tc.want)
		})
	}
}

func TestNVMLCommonAncestorLevels(t *testing.T) {
	tests := []struct {
		level nvml.GpuTopologyLevel
		want  topology.Link
	}{
		{nvml.TOPOLOGY_INTERNAL, topology.LinkPIX},
		{nvml.TOPOLOGY_SINGLE, topology.LinkPIX},
		{nvml.TOPOLOGY_MULTIPLE, topology.LinkPXB},
		{nvml.TOPOLOGY_HOSTBRIDGE, topology.LinkPHB},
		{nvml.TOPOLOGY_NODE, topology.LinkNODE},
		{nvml.TOPOLOGY_SYSTEM, topology.LinkSYS},
	}
	for _, tc := range tests {
		t.Run(tc.want.String(), func(t *testing.T) {
			box := fakeBox{
				gpus:     []fakeGPU{{busID: nvBus(1)}, {busID: nvBus(2)}},
				ancestor: func(i, j int) nvml.GpuTopologyLevel { return tc.level },
			}
			lib, _ := box.build()
			topo, err := newNVML(lib, fstest.MapFS{}).Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if got := topo.Link(0, 1); got != tc.want {
				t.Errorf("level %d: got %s, want %s", tc.level, got, tc.want)
			}
		})
	}
}

func TestNVMLHiddenPCIeTreeFallsBackOnNUMA(t *testing.T) {
	box := fakeBox{
		gpus: []fakeGPU{{busID: nvBus(1)}, {busID: nvBus(2)}, {busID: nvBus(3)}, {busID: nvBus(4)}},
	}
	lib, devs := box.build()
	numa := []int{0, 0, 1, -1}
	for i, d := range devs {
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) {
			if numa[i] < 0 {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return numa[i], nvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
	}
	topo, err := newNVML(lib, fstest.MapFS{}).Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	sameRows(t, matrix(topo), []string{
		"X NODE SYS SYS",
		"NODE X SYS SYS",
		"SYS SYS X SYS",
		"SYS SYS SYS X",
	})
}

func TestNVMLErrors(t *testing.T) {
	gpuLost := nvml.ERROR_GPU_IS_LOST
	tests := []struct {
		name     string
		mutate   func(lib *mock.Interface, devs []*mock.Device)
		wantIs   error
		wantText []string
	}{{
		name: "library missing",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
		},
		wantIs:   nvml.ERROR_LIBRARY_NOT_FOUND,
		wantText: []string{"libnvidia-ml.so", "driver root"},
	}, {
		name: "kernel module not loaded",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
		},
		wantIs:   nvml.ERROR_DRIVER_NOT_LOADED,
		wantText: []string{"kernel module"},
	}, {
		name: "device nodes not accessible",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
		},
		wantIs:   nvml.ERROR_NO_PERMISSION,
		wantText: []string{"/dev/nvidiactl"},
	}, {
		name: "driver and library versions differ",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIB_RM_VERSION_MISMATCH }
		},
		wantIs:   nvml.ERROR_LIB_RM_VERSION_MISMATCH,
		wantText: []string{"initialize NVML"},
	}, {
		name: "DeviceGetCount fails",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"DeviceGetCount"},
	}, {
		name: "DeviceGetCount returns more GPUs than the model holds",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 65, nvml.SUCCESS }
		},
		wantText: []string{"DeviceGetCount returned 65 GPUs"},
	}, {
		name: "SystemGetDriverVersion fails",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"SystemGetDriverVersion"},
	}, {
		name: "DeviceGetHandleByIndex fails",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, gpuLost }
		},
		wantIs:   gpuLost,
		wantText: []string{"GPU 0: DeviceGetHandleByIndex"},
	}, {
		name: "GetIndex negative",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[1].GetIndexFunc = func() (int, nvml.Return) { return -3, nvml.SUCCESS }
		},
		wantText: []string{"handle 1", "negative index -3"},
	}, {
		name: "GetUUID fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[2].GetUUIDFunc = func() (string, nvml.Return) { return "", gpuLost }
		},
		wantIs:   gpuLost,
		wantText: []string{"GPU 2: GetUUID"},
	}, {
		name: "GetArchitecture fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[1].GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"GPU 1: GetArchitecture"},
	}, {
		name: "GetMemoryInfo fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[3].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, gpuLost }
		},
		wantIs:   gpuLost,
		wantText: []string{"GPU 3: GetMemoryInfo"},
	}, {
		name: "malformed bus ID",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo("07:00"), nvml.SUCCESS }
		},
		wantText: []string{"GPU 0: GetPciInfo", `"07:00"`},
	}, {
		name: "empty bus ID",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.SUCCESS }
		},
		wantIs:   errEmptyBusID,
		wantText: []string{"GPU 0: GetPciInfo"},
	}, {
		name: "duplicate bus ID",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[4].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo("0000:1A:00.0"), nvml.SUCCESS }
		},
		wantText: []string{"GPU 0 and GPU 4 both report PCI bus ID 0000:1a:00.0"},
	}, {
		name: "GetNumaNodeId fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[5].GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"GPU 5: GetNumaNodeId"},
	}, {
		name: "GetNvLinkState fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[1].GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
				if l == 3 {
					return 0, gpuLost
				}
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
		},
		wantIs:   gpuLost,
		wantText: []string{"GPU 1: GetNvLinkState(link 3)"},
	}, {
		name: "GetNvLinkRemoteDeviceType fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[2].GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"GPU 2: GetNvLinkRemoteDeviceType(link 0)"},
	}, {
		name: "GetNvLinkRemotePciInfo fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[3].GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, gpuLost }
		},
		wantIs:   gpuLost,
		wantText: []string{"GPU 3: GetNvLinkRemotePciInfo(link 0)"},
	}, {
		name: "GetNvLinkRemotePciInfo returns garbage",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[3].GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return pciInfo("bogus"), nvml.SUCCESS }
		},
		wantText: []string{"GPU 3: GetNvLinkRemotePciInfo(link 0)", `"bogus"`},
	}, {
		name: "GetTopologyCommonAncestor fails",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[0].GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"GPU 0: GetTopologyCommonAncestor(GPU 2)"},
	}, {
		name: "GetTopologyCommonAncestor returns an unknown level",
		mutate: func(_ *mock.Interface, devs []*mock.Device) {
			devs[4].GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 99, nvml.SUCCESS }
		},
		wantText: []string{"GPU 4: GetTopologyCommonAncestor(GPU 5) returned unknown level 99"},
	}, {
		name: "Shutdown fails",
		mutate: func(lib *mock.Interface, _ []*mock.Device) {
			lib.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
		},
		wantIs:   nvml.ERROR_UNKNOWN,
		wantText: []string{"shut down NVML"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib, devs := bridgeBox().build()
			tc.mutate(lib, devs)
			topo, err := newNVML(lib, fstest.MapFS{}).Discover(context.Background())
			if err == nil {
				t.Fatalf("Discover succeeded with %d GPUs, want an error", topo.Len())
			}
			if topo != nil {
				t.Errorf("Discover returned a topology along with error %v", err)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %q does not wrap %v", err, tc.wantIs)
			}
			for _, s := range tc.wantText {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			inits, shutdowns := len(lib.InitCalls()), len(lib.ShutdownCalls())
			wantShutdowns := 1
			if lib.InitFunc() != nvml.SUCCESS {
				wantShutdowns = 0
			}
			if inits != 1 || shutdowns != wantShutdowns {
				t.Errorf("Init called %d times, Shutdown %d times; want 1 and %d", inits, shutdowns, wantShutdowns)
			}
		})
	}
}

func TestNVMLCanceledContext(t *testing.T) {
	lib, _ := bridgeBox().build()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := newNVML(lib, fstest.MapFS{}).Discover(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Discover with a canceled context: got %v, want context.Canceled", err)
	}
	if n := len(lib.InitCalls()); n != 0 {
		t.Errorf("Init called %d times for a canceled context", n)
	}
}

func TestNVMLDeviceFields(t *testing.T) {
	box := fakeBox{
		gpus:     []fakeGPU{{busID: "00000000:0A:00.0"}, {busID: "00010000:E1:00.0"}},
		ancestor: func(i, j int) nvml.GpuTopologyLevel { return sys },
	}
	sysRoot := fakeSysfs(
		sysDevice{busID: "0000:0a:00.0", root: "pci0000:00", numa: "1\n", cpus: "16-31,48-63\n"},
		sysDevice{busID: "10000:e1:00.0", root: "pci10000:e0", numa: "-1\n"},
	)
	tests := []struct {
		name   string
		mutate func(devs []*mock.Device)
		want   []topology.GPU
	}{{
		name: "identity from NVML, placement from sysfs",
		want: []topology.GPU{{
			Index: 0, Minor: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000",
			ProductName: "NVIDIA RTX A6000", Architecture: "ampere", CUDAComputeCapability: "8.6",
			DriverVersion: "550.54.15", MemoryBytes: 48 << 30,
			PCIBusID: "0000:0a:00.0", PCIeRoot: "pci0000:00", NUMANode: 1, CPUAffinity: "16-31,48-63",
		}, {
			Index: 1, Minor: 1, UUID: "GPU-00000000-0000-0000-0000-000000000001",
			ProductName: "NVIDIA RTX A6000", Architecture: "ampere", CUDAComputeCapability: "8.6",
			DriverVersion: "550.54.15", MemoryBytes: 48 << 30,
			PCIBusID: "10000:e1:00.0", PCIeRoot: "pci10000:e0", NUMANode: -1,
		}},
	}, {
		name: "NVML NUMA node wins; architecture from compute capability when NVML cannot say",
		mutate: func(devs []*mock.Device) {
			devs[0].GetNumaNodeIdFunc = func() (int, nvml.Return) { return 4, nvml.SUCCESS }
			devs[0].GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			devs[1].GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
				return nvml.DEVICE_ARCH_UNKNOWN, nvml.SUCCESS
			}
			devs[1].GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS }
		},
		want: []topology.GPU{{
			Index: 0, Minor: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000",
			ProductName: "NVIDIA RTX A6000", Architecture: "ampere", CUDAComputeCapability: "8.6",
			DriverVersion: "550.54.15", MemoryBytes: 48 << 30,
			PCIBusID: "0000:0a:00.0", PCIeRoot: "pci0000:00", NUMANode: 4, CPUAffinity: "16-31,48-63",
		}, {
			Index: 1, Minor: 1, UUID: "GPU-00000000-0000-0000-0000-000000000001",
			ProductName: "NVIDIA RTX A6000", Architecture: "hopper", CUDAComputeCapability: "9.0",
			DriverVersion: "550.54.15", MemoryBytes: 48 << 30,
			PCIBusID: "10000:e1:00.0", PCIeRoot: "pci10000:e0", NUMANode: -1,
		}},
	}, {
		name: "positions follow NVML indices, not handle order",
		mutate: func(devs []*mock.Device) {
			devs[0].GetIndexFunc = func() (int, nvml.Return) { return 1, nvml.SUCCESS }
			devs[1].GetIndexFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		},
		want: []topology.GPU{{
			Index: 0, Minor: 1, UUID: "GPU-00000000-0000-0000-0000-000000000001",
			ProductName: "NVIDIA RTX A6000", Architecture: "ampere", CUDAComputeCapability: "8.6",
			DriverVersion: "550.54.15", MemoryBytes: 48 << 30,
			PCIBusID: "10000:e1:00.0", PCIeRoot: "pci10000:e0", NUMANode: -1,
		}, {
			Index: 1, Minor: 0, UUID: "GPU-00000000-0000-0000-0000-000000000000",
			ProductName: "NVIDIA RTX A6000", Architecture: "ampere", CUDAComputeCapability: "8.6",
			DriverVersion: "550.54.15", MemoryBytes: 48 << 30,
			PCIBusID: "0000:0a:00.0", PCIeRoot: "pci0000:00", NUMANode: 1, CPUAffinity: "16-31,48-63",
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib, devs := box.build()
			if tc.mutate != nil {
				tc.mutate(devs)
			}
			topo, err := newNVML(lib, sysRoot).Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if topo.Len() != len(tc.want) {
				t.Fatalf("got %d GPUs, want %d", topo.Len(), len(tc.want))
			}
			for p, want := range tc.want {
				if got := topo.GPUs[p]; got != want {
					t.Errorf("position %d:\n got %+v\nwant %+v", p, got, want)
				}
			}
		})
	}
}

func TestNVMLNoGPUs(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
	}
	topo, err := newNVML(lib, fstest.MapFS{}).Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if topo.Len() != 0 {
		t.Errorf("got %d GPUs, want 0", topo.Len())
	}
}

// TestNewNVMLWithoutLibrary runs the real go-nvml binding against a library
// path that does not exist, which is what a node without the driver (or a
// plugin container without the driver root mounted) looks like.
func TestNewNVMLWithoutLibrary(t *testing.T) {
	d := NewNVML(nvml.New(nvml.WithLibraryPath("/nonexistent/driver-root/usr/lib64/libnvidia-ml.so.1")))
	_, err := d.Discover(context.Background())
	if !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Fatalf("Discover: got %v, want ERROR_LIBRARY_NOT_FOUND", err)
	}
	for _, want := range []string{"libnvidia-ml.so", "driver root"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
