package controller

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
)

// BenchmarkInventoryCollect measures one scrape of the per-node gauges on
// 256 nodes (half 8-GPU V100, half 16-GPU DGX-2), each with some GPUs held:
// steady (the fragmentation figures cached) and cold (every node's figure
// recomputed, as after every node changed).
func BenchmarkInventoryCollect(b *testing.B) {
	inv := planner.NewInventory()
	l := planner.NewLedger()
	for n := range 256 {
		fixture := "v100-sxm2-8-aliyun-sccgn6.txt"
		if n%2 == 1 {
			fixture = "dgx2-16.txt"
		}
		topo, err := controllertest.ParseFixture(fixture)
		if err != nil {
			b.Fatal(err)
		}
		node := fmt.Sprintf("node-%03d", n)
		s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := inv.Upsert(s); err != nil {
			b.Fatal(err)
		}
		held := controllertest.ClaimWith(fmt.Sprintf("c-%d", n), "1", controllertest.WholeResult("gpu-1"), controllertest.WholeResult("gpu-2"), controllertest.WholeResult(fmt.Sprintf("gpu-%d", 3+n%5)))
		for i := range held.Status.Allocation.Devices.Results {
			held.Status.Allocation.Devices.Results[i].Pool = node
		}
		l.Observe(held)
	}
	scrape := func(ic *inventoryCollector) int {
		ch := make(chan prometheus.Metric, 1024)
		done := make(chan int)
		go func() {
			n := 0
			for range ch {
				n++
			}
			done <- n
		}()
		ic.Collect(ch)
		close(ch)
		return <-done
	}
	b.Run("steady", func(b *testing.B) {
		ic := newInventoryCollector()
		ic.setSource(inv, l)
		scrape(ic)
		b.ResetTimer()
		for range b.N {
			scrape(ic)
		}
	})
	b.Run("cold", func(b *testing.B) {
		ic := newInventoryCollector()
		ic.setSource(inv, l)
		scrape(ic) // the idle-node figures are per inventory, computed once
		b.ResetTimer()
		for range b.N {
			clear(ic.frag)
			scrape(ic)
		}
	})
}
