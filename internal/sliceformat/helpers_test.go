package sliceformat

import (
	"path/filepath"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/driver/topology/topologytest"
)

const testNode = "node-a"

const gib = int64(1) << 30

// loadTopology is a topology of driver/topology/testdata with the identity
// NVML discovery would report.
func loadTopology(t testing.TB, file string) *topology.Topology {
	t.Helper()
	return topologytest.Load(t, filepath.Join("..", "..", "driver", "topology", "testdata", file))
}
