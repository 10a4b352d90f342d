package discovery

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulink/gpulink/driver/topology"
)

// readGPU reads one GPU's identity and placement. handleIndex is the index
// the handle was obtained with; it names the GPU in errors until NVML has
// told us the GPU's own index.
func (d *nvmlDiscoverer) readGPU(handleIndex int, h nvml.Device) (topology.GPU, error) {
	g := topology.GPU{NUMANode: -1}
	var ret nvml.Return

	if g.Index, ret = h.GetIndex(); ret != nvml.SUCCESS {
		return g, callError(handleIndex, "GetIndex", ret)
	}
	if g.Index < 0 {
		return g, fmt.Errorf("GPU at handle %d: GetIndex returned negative index %d", handleIndex, g.Index)
	}
	i := g.Index
	if g.Minor, ret = h.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, callError(i, "GetMinorNumber", ret)
	}
	if g.Minor < 0 {
		return g, fmt.Errorf("GPU %d: GetMinorNumber returned negative minor %d", i, g.Minor)
	}
	if g.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return g, callError(i, "GetUUID", ret)
	}
	if g.ProductName, ret = h.GetName(); ret != nvml.SUCCESS {
		return g, callError(i, "GetName", ret)
	}

	major, minor, ret := h.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return g, callError(i, "GetCudaComputeCapability", ret)
	}
	g.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)

	arch, ret := h.GetArchitecture()
	switch {
	case ret == nvml.SUCCESS:
		g.Architecture = archNames[arch]
	case !unavailable(ret):
		return g, callError(i, "GetArchitecture", ret)
	}
	if g.Architecture == "" {
		// Drivers before R470 lack the call; newer drivers report
		// architectures this build of gpulink does not know as numbers.
		g.Architecture = archFromComputeCapability(major, minor)
	}

	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, callError(i, "GetMemoryInfo", ret)
	}
	if mem.Total > math.MaxInt64 {
		return g, fmt.Errorf("GPU %d: GetMemoryInfo reports %d bytes total, more than int64 holds", i, mem.Total)
	}
	g.MemoryBytes = int64(mem.Total)

	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, callError(i, "GetPciInfo", ret)
	}
	busID, err := pciInfoBusID(pci)
	if err != nil {
		return g, fmt.Errorf("GPU %d: GetPciInfo: %w", i, err)
	}
	g.PCIBusID = busID

	if g.PCIeRoot, err = d.sys.pcieRoot(busID); err != nil {
		return g, fmt.Errorf("GPU %d: %w", i, err)
	}
	if g.NUMANode, err = d.numaNode(i, h, busID); err != nil {
		return g, err
	}
	if g.CPUAffinity, err = d.sys.cpuAffinity(busID); err != nil {
		return g, fmt.Errorf("GPU %d: %w", i, err)
	}
	if g.Clique, err = readClique(i, h); err != nil {
		return g, err
	}
	return g, nil
}

// numaNode prefers NVML's answer: on platforms where GPU memory is a NUMA
// node of its own (Grace Hopper, Grace Blackwell) only NVML knows it. On
// x86 NVML answers NOT_SUPPORTED and the PCIe device's sysfs numa_node is
// the node of the CPU socket the GPU hangs off.
func (d *nvmlDiscoverer) numaNode(index int, h nvml.Device, busID string) (int, error) {
	n, ret := h.GetNumaNodeId()
	switch {
	case ret == nvml.SUCCESS && n >= 0:
		return n, nil
	case ret == nvml.SUCCESS, unavailable(ret):
		n, err := d.sys.numaNode(busID)
		if err != nil {
			return -1, fmt.Errorf("GPU %d: %w", index, err)
		}
		return n, nil
	}
	return -1, callError(index, "GetNumaNodeId", ret)
}
