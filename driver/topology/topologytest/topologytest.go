// Package topologytest builds the topologies tests start from: a topology
// file completed with the identity NVML discovery reports, and a simulated
// DGX A100 with a MIG layout.
package topologytest

import (
	"fmt"
	"testing"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
)

const gib = int64(1) << 30

// Load parses the topology file at path and fills in what a topology file
// lacks and NVML discovery would report: minor numbers, UUIDs, a V100's
// product, architecture, compute capability, driver version and memory,
// and PCI bus IDs under one root.
func Load(t testing.TB, path string) *topology.Topology {
	t.Helper()
	topo, err := topology.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for p := range topo.GPUs {
		g := &topo.GPUs[p]
		g.Minor = g.Index
		g.UUID = fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", g.Index)
		g.ProductName = "Tesla V100-SXM2-16GB"
		g.Architecture = "volta"
		g.CUDAComputeCapability = "7.0"
		g.DriverVersion = "535.104.05"
		g.MemoryBytes = 16 * gib
		g.PCIBusID = fmt.Sprintf("0000:%02x:00.0", 0x10+g.Index)
		g.PCIeRoot = "pci0000:00"
	}
	return topo
}

// MIG is what discovery finds on a simulated DGX A100 (40GB) with the MIG
// layout (GPU index to profiles; GPUs not named stay out of MIG mode).
func MIG(t testing.TB, layout map[int][]string) *topology.Topology {
	t.Helper()
	topo, err := discovery.MockTopology("dgxa100", discovery.MockOptions{MIG: layout})
	if err != nil {
		t.Fatalf("MockTopology: %v", err)
	}
	return topo
}
