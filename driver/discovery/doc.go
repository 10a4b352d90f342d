// Package discovery finds the GPUs of a node and the links between them and
// returns them as a *topology.Topology. The kubelet plugin picks one of
// three backends:
//
//   - NewNVML asks NVML (libnvidia-ml.so.1, shipped with the driver) about
//     every GPU and every pair, and sysfs about what NVML does not report:
//     the PCIe root complex, the NUMA node on x86 and the local CPU list.
//     It is the backend for real nodes.
//   - NewMock runs the same NVML code path against one of go-nvml's
//     simulated DGX servers, completed with a realistic topology, for
//     clusters and tests without GPUs.
//   - NewTopologyFile serves the GPUs described by an `nvidia-smi topo -m`
//     output file, with identities taken from options, to simulate nodes of
//     any shape.
//
// # Link classes
//
// A pair connected by NVLink gets NV<lanes>; any other pair gets the PCIe
// class of its closest common ancestor as nvidia-smi prints it:
// PIX (same board or one switch), PXB (several switches), PHB (the host
// bridge), NODE (host bridges of one NUMA node) or SYS (across NUMA
// nodes). When the platform hides the PCIe tree (some hypervisors), a pair
// gets NODE if both GPUs report the same NUMA node and SYS otherwise:
// never more than can be proven.
//
// Lanes are counted per active link (state enabled) by the far end's PCI
// bus ID. Direct lanes between two GPUs count the smaller of the two ends'
// counts, so a lane that one end reports down does not make the matrix
// asymmetric. Links to a POWER9 CPU (NVLINK_DEVICE_TYPE_IBMNPU), loopback
// links and links to GPUs this process cannot see are ignored.
//
// # The NVSwitch rule
//
// On NVSwitch systems (DGX/HGX A100, H100, B200) a GPU's links end at
// switches, not at other GPUs, and every switch-attached GPU can reach
// every other at full bandwidth. A link counts as a switch link when NVML
// reports the far end as NVLINK_DEVICE_TYPE_SWITCH, or, on drivers that
// cannot tell the device type, when its bus ID belongs to no GPU. Two GPUs
// that both have switch links get NV<min(s1, s2)> on top of any direct
// lanes, where s1 and s2 are their switch lane counts: the thinner
// attachment limits the pair. A DGX A100 (12 links per GPU) thus shows
// NV12 between every pair, a DGX H100 NV18, exactly as nvidia-smi does.
//
// # MIG
//
// A GPU in MIG mode (current mode) carries its existing GPU and compute
// instances in topology.GPU.MIG (mig.go): profile, IDs, placement, the
// MIG device UUID (through the MIG device handles) and the minors of the
// /dev/nvidia-caps nodes that grant access to each instance, read from the
// driver's table /proc/driver/nvidia-caps/mig-minors. NVML has no
// profile names on older drivers, so names are derived (driver/mig). The
// mock backend answers the MIG handle calls go-nvml's servers leave unset
// and simulates the caps table; NewMockWith creates a MIG layout through
// NVML calls first.
//
// # Errors
//
// NVML answers NOT_SUPPORTED (and FUNCTION_NOT_FOUND on old drivers) for
// what a GPU cannot tell; discovery then falls back (architecture from the
// compute capability, NUMA node from sysfs, PCIe class instead of NVLink)
// or leaves the field unknown. Any other NVML failure aborts the discovery
// with an error naming the GPU index and the NVML call.
package discovery
