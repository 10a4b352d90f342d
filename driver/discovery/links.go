package discovery

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulink/gpulink/driver/topology"
)

// nvlinkEnds is what one GPU's active NVLinks reach.
type nvlinkEnds struct {
	// peers counts lanes to each other GPU, keyed by position.
	peers map[int]int
	// switchLanes counts lanes to NVSwitches.
	switchLanes int
}

// links computes the link matrix by position. NVLink wins over PCIe: a pair
// with any NVLink lanes gets NV<lanes>, other pairs the PCIe class of their
// closest common ancestor. See the package documentation for how lanes to
// NVSwitches count.
func (d *nvmlDiscoverer) links(ctx context.Context, devs []device) ([][]topology.Link, error) {
	n := len(devs)
	byBusID := make(map[string]int, n)
	for p, dev := range devs {
		byBusID[dev.gpu.PCIBusID] = p
	}
	ends := make([]nvlinkEnds, n)
	for p := range devs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("discover GPU links through NVML: %w", err)
		}
		e, err := nvlinkEndsOf(p, devs[p], byBusID)
		if err != nil {
			return nil, err
		}
		ends[p] = e
	}

	m := make([][]topology.Link, n)
	for i := range m {
		m[i] = make([]topology.Link, n)
	}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("discover GPU links through NVML: %w", err)
		}
		for j := i + 1; j < n; j++ {
			l, err := pairLink(devs[i], devs[j], ends[i], ends[j], i, j)
			if err != nil {
				return nil, err
			}
			m[i][j], m[j][i] = l, l
		}
	}
	return m, nil
}

// pairLink is the link between the GPUs at positions i and j.
func pairLink(a, b device, ea, eb nvlinkEnds, i, j int) (topology.Link, error) {
	// Both ends report the same bond on healthy hardware; taking the
	// smaller count keeps the matrix symmetric when one end has a lane down.
	lanes := min(ea.peers[j], eb.peers[i])
	if ea.switchLanes > 0 && eb.switchLanes > 0 {
		// Traffic between two switch-attached GPUs is limited by the
		// thinner of their two attachments.
		lanes += min(ea.switchLanes, eb.switchLanes)
	}
	if lanes > 0 {
		return topology.NVLink(lanes), nil
	}
	return pcieLink(a, b)
}

// nvlinkEndsOf walks every NVLink of the GPU at position self.
func nvlinkEndsOf(self int, dev device, byBusID map[string]int) (nvlinkEnds, error) {
	e := nvlinkEnds{peers: map[int]int{}}
	h, index := dev.handle, dev.gpu.Index
	for l := range nvml.NVLINK_MAX_LINKS {
		state, ret := h.GetNvLinkState(l)
		switch {
		case ret == nvml.ERROR_INVALID_ARGUMENT, unavailable(ret):
			// INVALID_ARGUMENT: the GPU has fewer links than NVML's
			// maximum. NOT_SUPPORTED: a PCIe-only GPU.
			continue
		case ret != nvml.SUCCESS:
			return e, callError(index, fmt.Sprintf("GetNvLinkState(link %d)", l), ret)
		case state != nvml.FEATURE_ENABLED:
			continue
		}

		kind, ret := h.GetNvLinkRemoteDeviceType(l)
		switch {
		case ret == nvml.SUCCESS:
		case unavailable(ret):
			// Drivers before R450 cannot tell; the bus ID decides below.
			kind = nvml.NVLINK_DEVICE_TYPE_UNKNOWN
		default:
			return e, callError(index, fmt.Sprintf("GetNvLinkRemoteDeviceType(link %d)", l), ret)
		}
		switch kind {
		case nvml.NVLINK_DEVICE_TYPE_SWITCH:
			e.switchLanes++
			continue
		case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
			// A link to a POWER9 CPU carries no GPU-to-GPU traffic.
			continue
		}

		pci, ret := h.GetNvLinkRemotePciInfo(l)
		switch {
		case unavailable(ret):
			// The far end cannot be named, so no pair can claim the lane.
			continue
		case ret != nvml.SUCCESS:
			return e, callError(index, fmt.Sprintf("GetNvLinkRemotePciInfo(link %d)", l), ret)
		}
		busID, err := pciInfoBusID(pci)
		if err != nil {
			return e, fmt.Errorf("GPU %d: GetNvLinkRemotePciInfo(link %d): %w", index, l, err)
		}
		peer, isGPU := byBusID[busID]
		switch {
		case isGPU && peer == self:
			// Loopback links (a GPU wired to itself) connect no pair.
		case isGPU:
			e.peers[peer]++
		case kind == nvml.NVLINK_DEVICE_TYPE_GPU:
			// A GPU this process cannot see (excluded by
			// NVIDIA_VISIBLE_DEVICES, or fallen off the bus).
		default:
			// Only NVSwitches are NVLink peers without being GPUs.
			e.switchLanes++
		}
	}
	return e, nil
}

// pcieLink maps NVML's closest common ancestor to nvidia-smi's legend.
func pcieLink(a, b device) (topology.Link, error) {
	level, ret := a.handle.GetTopologyCommonAncestor(b.handle)
	switch {
	case ret == nvml.SUCCESS:
	case unavailable(ret):
		// Some hypervisors hide the PCIe tree. Claim no more than the
		// NUMA placement proves: NODE for one node, SYS otherwise.
		if a.gpu.NUMANode >= 0 && a.gpu.NUMANode == b.gpu.NUMANode {
			return topology.LinkNODE, nil
		}
		return topology.LinkSYS, nil
	default:
		return topology.LinkNone, fmt.Errorf("GPU %d: GetTopologyCommonAncestor(GPU %d): %w", a.gpu.Index, b.gpu.Index, ret)
	}
	switch level {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE:
		return topology.LinkPIX, nil
	case nvml.TOPOLOGY_MULTIPLE:
		return topology.LinkPXB, nil
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return topology.LinkPHB, nil
	case nvml.TOPOLOGY_NODE:
		return topology.LinkNODE, nil
	case nvml.TOPOLOGY_SYSTEM:
		return topology.LinkSYS, nil
	}
	return topology.LinkNone, fmt.Errorf("GPU %d: GetTopologyCommonAncestor(GPU %d) returned unknown level %d", a.gpu.Index, b.gpu.Index, level)
}
