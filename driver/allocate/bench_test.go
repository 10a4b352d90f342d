package allocate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gpulink/gpulink/driver/topology"
)

// reportP50 times calls to fn one by one and reports the median and the
// 99th percentile as p50-ns/op and p99-ns/op next to the mean that ns/op
// shows.
func reportP50(b *testing.B, fn func()) {
	b.Helper()
	samples := make([]time.Duration, 0, min(b.N, 1<<16))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		fn()
		if len(samples) < cap(samples) {
			samples = append(samples, time.Since(start))
		}
	}
	b.StopTimer()
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Nanoseconds()), "p50-ns/op")
	b.ReportMetric(float64(samples[len(samples)*99/100].Nanoseconds()), "p99-ns/op")
}

// benchUsed marks every fourth GPU, starting at 1, exclusive.
func benchUsed(t *topology.Topology) *NodeState {
	var used []int
	for p := 1; p < t.Len(); p += 4 {
		used = append(used, p)
	}
	return nodeWith("bench", t, used...)
}

func BenchmarkAllocate(b *testing.B) {
	for _, tc := range []struct {
		name string
		topo *topology.Topology
	}{
		{"pcie-4", pcie4(b)},
		{"v100-8", v100(b)},
		{"dgx-a100-8", dgxA100(b)},
		{"pcie-16", pcie16(b)},
		{"dgx2-16", dgx2(b)},
		{"synthetic-32", synthetic32(b)},
		{"nvlink-tiered-32", nvlinkTiered(b)},
	} {
		for _, state := range []string{"idle", "one-used", "quarter-used"} {
			node := nodeWith("bench", tc.topo)
			switch state {
			case "one-used":
				// The most free GPUs a node in use has: the largest
				// search that is not an idle node's.
				node = nodeWith("bench", tc.topo, 1)
			case "quarter-used":
				node = benchUsed(tc.topo)
			}
			free := len(positions(freeMask(node)))
			for _, k := range []int{1, 2, 4, 8} {
				if k > free {
					continue
				}
				req := Request{GPUs: k}
				b.Run(fmt.Sprintf("%s/%s/gpus=%d", tc.name, state, k), func(b *testing.B) {
					reportP50(b, func() {
						if _, err := Allocate(node, req, Policy{}); err != nil {
							b.Fatal(err)
						}
					})
				})
				if free < memoMinFree {
					continue
				}
				// The same decision with the memo off: what the first
				// decision for a node kind and state costs, the kind
				// prepared (Prepare, as the controller does when it learns
				// a node's topology) and not.
				Prepare(tc.topo)
				for _, v := range []struct {
					name    string
					kindsOn bool
				}{{"cold", true}, {"cold-unprepared", false}} {
					b.Run(fmt.Sprintf("%s/%s/gpus=%d/%s", tc.name, state, k, v.name), func(b *testing.B) {
						defer setSearchCaches(false, v.kindsOn)()
						reportP50(b, func() {
							if _, err := Allocate(node, req, Policy{}); err != nil {
								b.Fatal(err)
							}
						})
					})
				}
			}
		}
	}
}

func BenchmarkAllocateShare(b *testing.B) {
	node := benchUsed(v100(b))
	node.Usage[2] = shared(2, 4, 30)
	req := share(4, 20)
	reportP50(b, func() {
		if _, err := Allocate(node, req, Policy{}); err != nil {
			b.Fatal(err)
		}
	})
}

// benchCluster builds 1,000 nodes of the given kinds with random usage.
func benchCluster(topos ...*topology.Topology) []*NodeState {
	rng := rand.New(rand.NewPCG(7, 7))
	nodes := make([]*NodeState, 1000)
	for i := range nodes {
		n := nodeWith(fmt.Sprintf("node-%04d", i), topos[i%len(topos)])
		for p := range n.Usage {
			switch rng.IntN(4) {
			case 0:
				n.Usage[p].Exclusive = true
			case 1:
				n.Usage[p] = shared(1, 4, 25)
			}
		}
		nodes[i] = n
	}
	return nodes
}

func BenchmarkChooseNode(b *testing.B) {
	pcie8 := generated(b, 8, 32, func(i, j int) string {
		if i/4 == j/4 {
			return "PIX"
		}
		return "SYS"
	})
	eight := benchCluster(v100(b), dgxA100(b), nvbridge(b), pcie8)
	sixteen := benchCluster(pcie16(b), dgx2(b))
	for _, tc := range []struct {
		name  string
		nodes []*NodeState
		req   Request
		pol   Policy
	}{
		{"1000x8/gpus=1", eight, Request{GPUs: 1}, Policy{}},
		{"1000x8/gpus=2", eight, Request{GPUs: 2}, Policy{}},
		{"1000x8/gpus=4", eight, Request{GPUs: 4}, Policy{}},
		{"1000x8/gpus=4/spread", eight, Request{GPUs: 4}, Policy{Node: Spread}},
		{"1000x8/gpus=2/nvlink", eight, Request{GPUs: 2, RequiredLink: topology.LinkNVLink}, Policy{}},
		{"1000x8/share", eight, share(4, 20), Policy{}},
		{"1000x16/gpus=4", sixteen, Request{GPUs: 4}, Policy{}},
		{"1000x16/gpus=8", sixteen, Request{GPUs: 8}, Policy{}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			nodes := tc.nodes
			reportP50(b, func() {
				if _, err := ChooseNode(nodes, tc.req, tc.pol); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
