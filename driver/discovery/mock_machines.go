package discovery

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// mockGPU is where one GPU of a simulated machine sits.
type mockGPU struct {
	busID    string // canonical PCI bus ID
	pcieRoot string // root complex, "pci<domain>:<bus>"
	// pcieSwitch groups GPUs behind one PCIe switch; distinct numbers
	// mean distinct switches.
	pcieSwitch int
	socket     int
	numaNode   int
	cpus       string // local_cpulist
}

// mockMachine describes a DGX well enough to answer NVML's topology
// calls, which the go-nvml mock servers leave unimplemented.
type mockMachine struct {
	newServer func() *server.Server
	gpus      []mockGPU
	// nvswitches are the bus IDs of the NVSwitch chips; GPU link l goes to
	// switch l mod len(nvswitches), spreading links as evenly as the
	// hardware does.
	nvswitches  []string
	linksPerGPU int
}

// mockMachines are the servers NewMock accepts.
var mockMachines = map[string]mockMachine{
	// DGX A100: two AMD EPYC 7742 sockets in NPS4 mode (four NUMA nodes
	// each), GPU pairs behind one two-level PCIe switch, six NVSwitch 2
	// chips with two links from each GPU (12 lanes, NV12).
	"dgxa100": {
		newServer: dgxa100.New,
		gpus: []mockGPU{
			{busID: "0000:07:00.0", pcieRoot: "pci0000:00", pcieSwitch: 0, socket: 0, numaNode: 3, cpus: "48-63,176-191"},
			{busID: "0000:0f:00.0", pcieRoot: "pci0000:00", pcieSwitch: 0, socket: 0, numaNode: 3, cpus: "48-63,176-191"},
			{busID: "0000:47:00.0", pcieRoot: "pci0000:40", pcieSwitch: 1, socket: 0, numaNode: 1, cpus: "16-31,144-159"},
			{busID: "0000:4e:00.0", pcieRoot: "pci0000:40", pcieSwitch: 1, socket: 0, numaNode: 1, cpus: "16-31,144-159"},
			{busID: "0000:87:00.0", pcieRoot: "pci0000:80", pcieSwitch: 2, socket: 1, numaNode: 7, cpus: "112-127,240-255"},
			{busID: "0000:90:00.0", pcieRoot: "pci0000:80", pcieSwitch: 2, socket: 1, numaNode: 7, cpus: "112-127,240-255"},
			{busID: "0000:b7:00.0", pcieRoot: "pci0000:a0", pcieSwitch: 3, socket: 1, numaNode: 5, cpus: "80-95,208-223"},
			{busID: "0000:bd:00.0", pcieRoot: "pci0000:a0", pcieSwitch: 3, socket: 1, numaNode: 5, cpus: "80-95,208-223"},
		},
		nvswitches:  []string{"0000:c4:00.0", "0000:c5:00.0", "0000:c6:00.0", "0000:c7:00.0", "0000:c8:00.0", "0000:c9:00.0"},
		linksPerGPU: 12,
	},
	// DGX H100: two Intel Xeon 8480C sockets, every GPU on a PCIe root of
	// its own, four NVSwitch 3 chips with 18 links from each GPU (NV18).
	"dgxh100": {
		newServer:   dgxh100.New,
		gpus:        dgxHopperGPUs,
		nvswitches:  []string{"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"},
		linksPerGPU: 18,
	},
	// DGX H200: the DGX H100 chassis with H200 GPUs.
	"dgxh200": {
		newServer:   dgxh200.New,
		gpus:        dgxHopperGPUs,
		nvswitches:  []string{"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"},
		linksPerGPU: 18,
	},
	// DGX B200: the same two-socket PCIe layout, two NVSwitch 5 chips
	// with 18 NVLink 5 links from each GPU (NV18).
	"dgxb200": {
		newServer:   dgxb200.New,
		gpus:        dgxHopperGPUs,
		nvswitches:  []string{"0000:05:00.0", "0000:06:00.0"},
		linksPerGPU: 18,
	},
}

// dgxHopperGPUs is the PCIe layout of a DGX H100: GPU0-3 on socket 0,
// GPU4-7 on socket 1, each GPU behind its own switch on its own root.
var dgxHopperGPUs = []mockGPU{
	{busID: "0000:1b:00.0", pcieRoot: "pci0000:15", pcieSwitch: 0, socket: 0, numaNode: 0, cpus: "0-55,112-167"},
	{busID: "0000:43:00.0", pcieRoot: "pci0000:3d", pcieSwitch: 1, socket: 0, numaNode: 0, cpus: "0-55,112-167"},
	{busID: "0000:52:00.0", pcieRoot: "pci0000:4c", pcieSwitch: 2, socket: 0, numaNode: 0, cpus: "0-55,112-167"},
	{busID: "0000:61:00.0", pcieRoot: "pci0000:5b", pcieSwitch: 3, socket: 0, numaNode: 0, cpus: "0-55,112-167"},
	{busID: "0000:9d:00.0", pcieRoot: "pci0000:97", pcieSwitch: 4, socket: 1, numaNode: 1, cpus: "56-111,168-223"},
	{busID: "0000:c3:00.0", pcieRoot: "pci0000:bd", pcieSwitch: 5, socket: 1, numaNode: 1, cpus: "56-111,168-223"},
	{busID: "0000:d1:00.0", pcieRoot: "pci0000:cb", pcieSwitch: 6, socket: 1, numaNode: 1, cpus: "56-111,168-223"},
	{busID: "0000:df:00.0", pcieRoot: "pci0000:d9", pcieSwitch: 7, socket: 1, numaNode: 1, cpus: "56-111,168-223"},
}
