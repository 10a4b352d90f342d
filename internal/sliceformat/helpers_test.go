package sliceformat

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

const testNode = "node-a"

const gib = int64(1) << 30

// loadTopology parses a topology of driver/topology/testdata and fills in
// what a topology file lacks, like NVML discovery would.
func loadTopology(t testing.TB, file string) *topology.Topology {
	t.Helper()
	topo, err := topology.ParseFile(filepath.Join("..", "..", "driver", "topology", "testdata", file))
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
