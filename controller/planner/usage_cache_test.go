package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// The usage cache gives what the ledger says at every read, whatever
// changed in between (claims assumed, settled, released, on any node),
// and reads the ledger again only for the nodes whose pool changed.
func TestUsageCacheFollowsTheLedger(t *testing.T) {
	inv := NewInventory()
	for i := range 6 {
		if err := inv.Upsert(controllertest.V100Slice(t, fmt.Sprintf("n%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	nodes := inv.All()
	l := NewLedger()
	c := newUsageCache()
	read := func(step int) {
		r := c.reader(l, nodes)
		for _, n := range nodes {
			if got, want := r(n), l.NodeUsage(n); !slices.Equal(got, want) {
				t.Fatalf("step %d, node %s: cached usage %+v, ledger %+v", step, n.Node, got, want)
			}
		}
	}
	first := c.reader(l, nodes)(nodes[0])
	if again := c.reader(l, nodes)(nodes[0]); &again[0] != &first[0] {
		t.Error("an unchanged node's usage was read from the ledger again")
	}
	r := rand.New(rand.NewPCG(1, 2))
	var live []types.UID
	for step := range 400 {
		switch {
		case len(live) > 0 && r.IntN(3) == 0:
			k := r.IntN(len(live))
			l.Forget(live[k])
			live = slices.Delete(live, k, k+1)
		default:
			n := nodes[r.IntN(len(nodes))]
			uid := types.UID(fmt.Sprintf("c%d", step))
			d := n.Devices[r.IntN(len(n.Devices))].Name
			use := DeviceUse{Key: DeviceKey{Pool: n.Pool, Device: d}, Exclusive: r.IntN(2) == 0}
			if !use.Exclusive {
				use.MemoryBytes, use.Cores = 1<<30, 10
			}
			settle, ok := l.Assume(uid, []DeviceUse{use})
			if !ok {
				t.Fatalf("step %d: assume refused", step)
			}
			if r.IntN(4) == 0 {
				settle("", false) // a failed write: the usage goes back
			} else {
				settle(fmt.Sprint(step), true)
				live = append(live, uid)
			}
		}
		if step%7 == 0 {
			read(step)
		}
	}
	read(400)
}

// A replaced node inventory (its slices changed) is forgotten once the
// cache holds many more nodes than are asked for.
func TestUsageCachePrunesReplacedNodes(t *testing.T) {
	l := NewLedger()
	c := newUsageCache()
	var last []*NodeInventory
	for round := range 40 {
		inv := NewInventory()
		for i := range 4 {
			if err := inv.Upsert(controllertest.V100Slice(t, fmt.Sprintf("n%d", i))); err != nil {
				t.Fatal(err)
			}
		}
		last = inv.All()
		r := c.reader(l, last)
		for _, n := range last {
			r(n)
		}
		c.prune(last)
		if len(c.entries) > 2*len(last)+64 {
			t.Fatalf("round %d: %d entries kept for %d nodes", round, len(c.entries), len(last))
		}
	}
	for _, n := range last {
		if _, ok := c.entries[n]; !ok {
			t.Errorf("node %s asked for last was pruned", n.Node)
		}
	}
}

// BenchmarkNodesNow5000Nodes is one weighing's read of the nodes
// (nodesNow) over BenchmarkDecision5000Nodes's cluster with its usage in
// a real ledger, 16 nodes changed between weighings (a young mix is
// weighed after 16 pods or fewer): "ledger" reads every device's usage
// from the ledger, as every weighing did before the cache; "cached" is
// the planner's usageCache.
func BenchmarkNodesNow5000Nodes(b *testing.B) {
	pc, nodes, filter := benchCluster(b, 8)
	l := NewLedger()
	step := 0
	assume := func(n *NodeInventory) {
		for p, u := range pc.usage[n.Node] {
			if !u.Exclusive && u.Shares == 0 {
				continue
			}
			uid := types.UID(fmt.Sprintf("c%d", step))
			step++
			settle, ok := l.Assume(uid, []DeviceUse{{Key: DeviceKey{Pool: n.Pool, Device: n.Devices[p].Name}, Exclusive: u.Exclusive, MemoryBytes: u.MemoryBytes, Cores: u.Cores}})
			if !ok {
				b.Fatal("assume refused")
			}
			settle(fmt.Sprint(step), true)
		}
	}
	for _, n := range nodes {
		assume(n)
	}
	r := rand.New(rand.NewPCG(3, 4))
	cache := newUsageCache()
	for _, v := range []struct {
		name string
		// usage is what one weighing reads the nodes' usage with.
		usage func() func(*NodeInventory) []allocate.GPUUsage
	}{
		{"ledger", func() func(*NodeInventory) []allocate.GPUUsage { return l.NodeUsage }},
		{"cached", func() func(*NodeInventory) []allocate.GPUUsage { return cache.reader(l, nodes) }},
	} {
		b.Run(v.name, func(b *testing.B) {
			filter.nodesNow(nodes, v.usage())
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for range 16 {
					assume(nodes[r.IntN(len(nodes))])
				}
				b.StartTimer()
				if got := filter.nodesNow(nodes, v.usage()); len(got) != len(nodes) {
					b.Fatalf("%d nodes read, want %d", len(got), len(nodes))
				}
			}
		})
	}
}
