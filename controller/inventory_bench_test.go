package controller

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// BenchmarkInventoryUpsert5000Nodes measures the controller's startup
// path: the ResourceSlice informer delivering 5,000 eight-GPU nodes of
// mixed kinds, one slice each, into an empty inventory. It reports the
// time for all 5,000 upserts (ms/5000-nodes) and per upsert (ns/op is
// for the whole batch).
func BenchmarkInventoryUpsert5000Nodes(b *testing.B) {
	const nodes = 5000
	slices := MixedEightGPUSlices(b, nodes)
	b.ReportAllocs()
	for b.Loop() {
		inv := NewInventory()
		for _, s := range slices {
			if err := inv.Upsert(s); err != nil {
				b.Fatal(err)
			}
		}
		if len(inv.nodes) != nodes {
			b.Fatalf("%d nodes, want %d", len(inv.nodes), nodes)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/5000-nodes")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/nodes, "ns/upsert")
}

// eightGPUFixtures are the eight-GPU node kinds of the 5,000-node
// benchmarks: NVLink meshes, NVSwitch boxes and PCIe switch trees.
var eightGPUFixtures = []string{"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
	"v100-sxm2-8-aliyun-sccgn6.txt", "pcie-nvbridge-8.txt", "pcie-pex-8.txt", "pcie-switch-8.txt"}

// mixedEightGPUSlices returns one slice per node for n nodes named
// node-00000..., their kinds taken from eightGPUFixtures in turn.
func MixedEightGPUSlices(tb testing.TB, n int) []*resourceapi.ResourceSlice {
	tb.Helper()
	out := make([]*resourceapi.ResourceSlice, 0, n)
	for i := range n {
		topo, err := parseFixture(eightGPUFixtures[i%len(eightGPUFixtures)])
		if err != nil {
			tb.Fatal(err)
		}
		s, err := controllertest.Slice(fmt.Sprintf("node-%05d", i), topo, controllertest.SliceOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}
