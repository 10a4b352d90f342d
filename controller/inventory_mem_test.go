package controller

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
)

// BenchmarkInventoryHeapPerNode reports the live heap the controller's
// inventory holds per node, for 5,000 eight-GPU nodes of mixed kinds, and
// what the decoded ResourceSlices themselves (as the informer caches
// them) take; the inventory refers to the slices' attribute and capacity
// maps rather than copying them. GPULINK_HEAP_PROFILE names a file for a heap profile taken
// with the inventory live.
func BenchmarkInventoryHeapPerNode(b *testing.B) {
	const nodes = 5000
	for b.Loop() {
		start := liveHeap()
		slices := controllertest.MixedEightGPUSlices(b, nodes)
		before := liveHeap()
		inv := planner.NewInventory()
		for _, s := range slices {
			if err := inv.Upsert(s); err != nil {
				b.Fatal(err)
			}
		}
		after := liveHeap()
		if f := os.Getenv("GPULINK_HEAP_PROFILE"); f != "" {
			writeHeapProfile(b, f)
		}
		runtime.KeepAlive(inv)
		runtime.KeepAlive(slices)
		b.ReportMetric(float64(after-before)/nodes/1024, "inventory-KiB/node")
		b.ReportMetric(float64(before-start)/nodes/1024, "slices-KiB/node")
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkInformerSliceHeapPerNode reports the live heap of 5,000 nodes'
// ResourceSlices decoded from JSON as the informer receives them, as
// decoded (raw) and after the informer's transform (transformed).
func BenchmarkInformerSliceHeapPerNode(b *testing.B) {
	eight := []string{"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
		"v100-sxm2-8-aliyun-sccgn6.txt", "pcie-nvbridge-8.txt", "pcie-pex-8.txt", "pcie-switch-8.txt"}
	const nodes = 5000
	var wire [][]byte
	for i := range nodes {
		topo, err := controllertest.ParseFixture(eight[i%len(eight)])
		if err != nil {
			b.Fatal(err)
		}
		s, err := controllertest.Slice(fmt.Sprintf("node-%05d", i), topo, controllertest.SliceOptions{})
		if err != nil {
			b.Fatal(err)
		}
		raw, err := json.Marshal(s)
		if err != nil {
			b.Fatal(err)
		}
		wire = append(wire, raw)
	}
	for _, mode := range []string{"raw", "transformed"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				start := liveHeap()
				cache := make([]any, 0, nodes)
				for _, raw := range wire {
					s := &resourceapi.ResourceSlice{}
					if err := json.Unmarshal(raw, s); err != nil {
						b.Fatal(err)
					}
					var obj any = s
					if mode == "transformed" {
						var err error
						if obj, err = transformObject(s); err != nil {
							b.Fatal(err)
						}
					}
					cache = append(cache, obj)
				}
				end := liveHeap()
				if f := os.Getenv("GPULINK_HEAP_PROFILE"); f != "" {
					writeHeapProfile(b, f+"."+mode)
				}
				runtime.KeepAlive(cache)
				b.ReportMetric(float64(end-start)/nodes/1024, "KiB/node")
			}
		})
	}
}

func writeHeapProfile(b *testing.B, name string) {
	out, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if err := pprof.WriteHeapProfile(out); err != nil {
		b.Fatal(err)
	}
}
