package gang

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkPlace is the decision time of issue 31: a gang of 64 pods × 8
// GPUs on 5,000 8-GPU nodes, the cluster about half used (a random 45 % of
// nodes busy, some of the rest partly), over the SuperPOD and NVL72
// hierarchies, without and with a demand of 32 shapes. It reports p50 and
// p99 (goal: p99 < 100 ms) over states drawn before the timer starts.
func BenchmarkPlace(b *testing.B) {
	h := DefaultHierarchy()
	// A demand of 32 shapes, as the replay's history passes it.
	var demand []Shape
	for i := range 32 {
		demand = append(demand, Shape{Pods: 1 + i*4, GPUsPerPod: []int{8, 1, 2, 4}[i%4], Count: 1 + i%5})
	}
	for _, bc := range []struct {
		c      cluster
		demand []Shape
	}{{superPODCluster(5000), nil}, {nvl72Cluster(5000), nil}, {superPODCluster(5000), demand}, {nvl72Cluster(5000), demand}} {
		c := bc.c
		name := fmt.Sprintf("%s-5000-nodes-64x8", c.name)
		if bc.demand != nil {
			name += "-demand-32-shapes"
		}
		b.Run(name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(64, 8))
			states := make([][]Node, 16)
			for s := range states {
				used := map[int]int{}
				for i := range c.nodes {
					switch x := r.IntN(100); {
					case x < 45:
						used[i] = 8
					case x < 60:
						used[i] = 1 + r.IntN(7)
					}
				}
				states[s] = c.build(used, 8)
			}
			req := Request{Name: "bench", Pods: 64, GPUsPerPod: 8, Demand: bc.demand}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, err := Place(h, req, states[i%len(states)]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
		})
	}
}
