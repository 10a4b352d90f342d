package discovery

import (
	"fmt"
	"io/fs"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeLink is one active NVLink of a hand-built GPU.
type fakeLink struct {
	remote string // far end's bus ID as NVML spells it
	kind   nvml.IntNvLinkDeviceType
}

// fakeGPU describes one GPU of a hand-built box.
type fakeGPU struct {
	busID string // as NVML spells it, e.g. "00000000:07:00.0"
	links []fakeLink
}

// fakeBox is a hand-built machine: mock.Interface and mock.Device with
// every function field discovery calls set to healthy defaults, which
// single tests then override to inject faults.
type fakeBox struct {
	gpus     []fakeGPU
	ancestor func(i, j int) nvml.GpuTopologyLevel
}

// nvBus is the NVML spelling of bus number b in domain 0.
func nvBus(b int) string { return fmt.Sprintf("00000000:%02X:00.0", b) }

// gpuLinks returns n links to the GPU at bus b.
func gpuLinks(b, n int) []fakeLink {
	return repeatLinks(fakeLink{remote: nvBus(b), kind: nvml.NVLINK_DEVICE_TYPE_GPU}, n)
}

func repeatLinks(l fakeLink, n int) []fakeLink {
	out := make([]fakeLink, n)
	for i := range out {
		out[i] = l
	}
	return out
}

func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(busID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(busID[i])
	}
	return p
}

func (b fakeBox) build() (*mock.Interface, []*mock.Device) {
	devs := make([]*mock.Device, len(b.gpus))
	for i, g := range b.gpus {
		devs[i] = fakeDevice(i, g)
	}
	for i, d := range devs {
		d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			for j, o := range devs {
				if o == other {
					return b.ancestor(i, j), nvml.SUCCESS
				}
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
	}
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(n int) (nvml.Device, nvml.Return) {
			if n < 0 || n >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[n], nvml.SUCCESS
		},
	}
	return lib, devs
}

func fakeDevice(i int, g fakeGPU) *mock.Device {
	return &mock.Device{
		GetIndexFunc:       func() (int, nvml.Return) { return i, nvml.SUCCESS },
		GetMinorNumberFunc: func() (int, nvml.Return) { return i, nvml.SUCCESS },
		GetUUIDFunc: func() (string, nvml.Return) {
			return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i), nvml.SUCCESS
		},
		GetNameFunc:                  func() (string, nvml.Return) { return "NVIDIA RTX A6000", nvml.SUCCESS },
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 8, 6, nvml.SUCCESS },
		GetArchitectureFunc: func() (nvml.DeviceArchitecture, nvml.Return) {
			return nvml.DEVICE_ARCH_AMPERE, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 48 << 30}, nvml.SUCCESS
		},
		GetPciInfoFunc:    func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.busID), nvml.SUCCESS },
		GetNumaNodeIdFunc: func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		// An RTX A6000 has no NVLink fabric.
		GetGpuFabricInfoFunc: func() (nvml.GpuFabricInfo, nvml.Return) {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		},
		// An RTX A6000 cannot do MIG.
		GetMigModeFunc: func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED },
		GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
			if l < 0 || l >= len(g.links) {
				return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		},
		GetNvLinkRemoteDeviceTypeFunc: func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if l < 0 || l >= len(g.links) {
				return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
			}
			return g.links[l].kind, nvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(l int) (nvml.PciInfo, nvml.Return) {
			if l < 0 || l >= len(g.links) {
				return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return pciInfo(g.links[l].remote), nvml.SUCCESS
		},
	}
}

// sysDevice is what a fake sysfs knows about one PCI device.
type sysDevice struct {
	busID, root, numa, cpus string // numa/cpus "" means the file is absent
}

// fakeSysfs lays devices out as the kernel does: bus/pci/devices/<id> is a
// relative symlink into devices/<root>/<port>/<id>.
func fakeSysfs(devs ...sysDevice) fs.ReadLinkFS {
	fsys := fstest.MapFS{}
	for _, d := range devs {
		dir := "devices/" + d.root + "/0000:00:01.0/" + d.busID
		fsys["bus/pci/devices/"+d.busID] = &fstest.MapFile{Data: []byte("../../../" + dir), Mode: fs.ModeSymlink}
		if d.numa != "" {
			fsys[dir+"/numa_node"] = &fstest.MapFile{Data: []byte(d.numa)}
		}
		if d.cpus != "" {
			fsys[dir+"/local_cpulist"] = &fstest.MapFile{Data: []byte(d.cpus)}
		}
	}
	return fsys
}
