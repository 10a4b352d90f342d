package discovery

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulink/gpulink/driver/topology"
)

// MockServers lists the names NewMock accepts, sorted.
func MockServers() []string {
	return slices.Sorted(maps.Keys(mockMachines))
}

// NewMock returns a Discoverer that runs the NVML backend against one of
// go-nvml's simulated DGX servers ("dgxa100", "dgxh100", "dgxh200",
// "dgxb200"), so the whole NVML code path works without a GPU.
//
// The go-nvml servers simulate identity, memory and MIG but not the
// machine around the GPUs: they leave the NVLink and PCIe topology calls
// unset and report no PCI bus ID. NewMock fills in what is missing (and
// keeps whatever a server already implements) from a description of the
// real DGX: bus IDs, NVLinks to NVSwitches, PCIe common ancestors, and a
// simulated sysfs with PCIe roots, NUMA nodes and CPU lists. UUIDs are
// random per NewMock call, as the go-nvml servers make them.
func NewMock(name string) (Discoverer, error) {
	return NewMockWith(name, MockOptions{})
}

// NewMockWith is NewMock with GPUs in MIG mode (mock_mig.go): the layout
// is created through the same NVML calls an operator's tools make, and
// discovered through the NVML backend's MIG code.
func NewMockWith(name string, o MockOptions) (Discoverer, error) {
	m, ok := mockMachines[name]
	if !ok {
		return nil, fmt.Errorf("mock server %q: want one of %s", name, strings.Join(MockServers(), ", "))
	}
	s := m.newServer()
	if err := m.install(s); err != nil {
		return nil, fmt.Errorf("mock server %q: %w", name, err)
	}
	if err := createMockMIG(s, o.MIG); err != nil {
		return nil, fmt.Errorf("mock server %q: %w", name, err)
	}
	if o.Fabric != nil {
		info := *o.Fabric
		for _, d := range s.Devices {
			if dev, ok := d.(*server.Device); ok {
				dev.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) { return info, nvml.SUCCESS }
			}
		}
	}
	d := newNVML(s, m.sysfs())
	d.proc = mockProc(len(s.Devices))
	return d, nil
}

// MockTopology is what NVML discovery finds on the named go-nvml mock
// server with the MIG layout of o: the topology tests and simulations
// start from.
func MockTopology(name string, o MockOptions) (*topology.Topology, error) {
	d, err := NewMockWith(name, o)
	if err != nil {
		return nil, err
	}
	return d.Discover(context.Background())
}

// install completes the server's devices with the machine's topology.
func (m mockMachine) install(s *server.Server) error {
	if len(s.Devices) != len(m.gpus) {
		return fmt.Errorf("server simulates %d GPUs, machine description has %d", len(s.Devices), len(m.gpus))
	}
	positions := make(map[nvml.Device]int, len(s.Devices))
	for p, d := range s.Devices {
		positions[d] = p
	}
	switches := make([]pciAddress, len(m.nvswitches))
	for k, id := range m.nvswitches {
		a, err := parseBusID(id)
		if err != nil {
			return fmt.Errorf("NVSwitch %d: %w", k, err)
		}
		switches[k] = a
	}
	for p, d := range s.Devices {
		dev, ok := d.(*server.Device)
		if !ok {
			return fmt.Errorf("GPU %d: device is a %T, want *server.Device", p, d)
		}
		addr, err := parseBusID(m.gpus[p].busID)
		if err != nil {
			return fmt.Errorf("GPU %d: %w", p, err)
		}
		m.installDevice(p, dev, addr, switches, positions)
		installMIGHandles(dev)
		installMIGInstances(dev)
	}
	return nil
}

func (m mockMachine) installDevice(p int, dev *server.Device, addr pciAddress, switches []pciAddress, positions map[nvml.Device]int) {
	// DeviceGetHandleByPciBusId looks devices up by this field.
	dev.PciBusID = addr.String()

	// The server answers GetPciInfo with the device ID only; add the
	// address on top of whatever it returns.
	if base := dev.GetPciInfoFunc; base != nil {
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			info, ret := base()
			if ret != nvml.SUCCESS {
				return info, ret
			}
			return nvmlPCIInfo(info, addr), nvml.SUCCESS
		}
	} else {
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvmlPCIInfo(nvml.PciInfo{}, addr), nvml.SUCCESS
		}
	}

	validLink := func(l int) bool { return l >= 0 && l < m.linksPerGPU && len(switches) > 0 }
	if dev.GetNvLinkStateFunc == nil {
		dev.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
			if !validLink(l) {
				// What the real library says for a link the GPU lacks.
				return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
	}
	if dev.GetNvLinkRemoteDeviceTypeFunc == nil {
		dev.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if !validLink(l) {
				return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
	}
	if dev.GetNvLinkRemotePciInfoFunc == nil {
		dev.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
			if !validLink(l) {
				return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvmlPCIInfo(nvml.PciInfo{}, switches[l%len(switches)]), nvml.SUCCESS
		}
	}
	if dev.GetTopologyCommonAncestorFunc == nil {
		dev.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			q, ok := positions[other]
			if !ok {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return m.commonAncestor(p, q), nvml.SUCCESS
		}
	}
	if dev.GetNumaNodeIdFunc == nil {
		// x86 GPUs are no NUMA nodes of their own; NVML says so and
		// leaves the answer to sysfs.
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
	}
	if dev.GetGpuFabricInfoFunc == nil {
		// A DGX's NVSwitches are inside the box: no multi-node NVLink
		// fabric, which NVML reports as not supported
		// (MockOptions.Fabric simulates one).
		dev.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
	}
}

// commonAncestor is the closest PCIe element GPUs p and q share.
func (m mockMachine) commonAncestor(p, q int) nvml.GpuTopologyLevel {
	a, b := m.gpus[p], m.gpus[q]
	switch {
	case p == q:
		return nvml.TOPOLOGY_INTERNAL
	case a.pcieSwitch == b.pcieSwitch:
		// DGX GPU pairs sit behind two levels of one switch complex.
		return nvml.TOPOLOGY_MULTIPLE
	case a.pcieRoot == b.pcieRoot:
		return nvml.TOPOLOGY_HOSTBRIDGE
	case a.socket == b.socket:
		return nvml.TOPOLOGY_NODE
	}
	return nvml.TOPOLOGY_SYSTEM
}

// sysfs builds the slice of /sys the NVML backend reads: the
// bus/pci/devices symlinks into the devices/ hierarchy, and each GPU's
// numa_node and local_cpulist.
func (m mockMachine) sysfs() fs.ReadLinkFS {
	fsys := fstest.MapFS{}
	for _, g := range m.gpus {
		rootPort := strings.TrimPrefix(g.pcieRoot, "pci") + ":01.1"
		dir := path.Join("devices", g.pcieRoot, rootPort, g.busID)
		fsys[path.Join(dir, "numa_node")] = &fstest.MapFile{Data: []byte(strconv.Itoa(g.numaNode) + "\n"), Mode: 0o444}
		fsys[path.Join(dir, "local_cpulist")] = &fstest.MapFile{Data: []byte(g.cpus + "\n"), Mode: 0o444}
		fsys[devicePath(g.busID)] = &fstest.MapFile{Data: []byte("../../../" + dir), Mode: fs.ModeSymlink | 0o777}
	}
	return fsys
}
