package planner

import (
	"testing"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// BenchmarkInventoryUpsert5000Nodes measures the controller's startup
// path: the ResourceSlice informer delivering 5,000 eight-GPU nodes of
// mixed kinds, one slice each, into an empty inventory. It reports the
// time for all 5,000 upserts (ms/5000-nodes) and per upsert (ns/op is
// for the whole batch).
func BenchmarkInventoryUpsert5000Nodes(b *testing.B) {
	const nodes = 5000
	slices := controllertest.MixedEightGPUSlices(b, nodes)
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
