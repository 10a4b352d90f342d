package allocate

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// setSearchCaches turns the memo and the kind tables on or off, and
// returns a function that restores them.
func setSearchCaches(memoOn, kindsOn bool) func() {
	memo.mu.Lock()
	oldMemo := memo.off
	memo.off = !memoOn
	memo.mu.Unlock()
	kinds.mu.Lock()
	oldKinds := kinds.off
	kinds.off = !kindsOn
	kinds.mu.Unlock()
	return func() {
		memo.mu.Lock()
		memo.off = oldMemo
		memo.mu.Unlock()
		kinds.mu.Lock()
		kinds.off = oldKinds
		kinds.mu.Unlock()
	}
}

// randomTopology is an n-GPU machine of random groups: links within a
// group are one class, across groups another, with random NVLink pairs on
// top, so that it has both symmetries and broken ones.
func randomTopology(tb testing.TB, rng *rand.Rand, n int) *topology.Topology {
	groups := 1 + rng.IntN(4)
	classes := []string{"PIX", "PXB", "PHB", "NODE", "SYS"}
	inner, outer := classes[rng.IntN(2)], classes[2+rng.IntN(3)]
	nv := map[[2]int]string{}
	for range rng.IntN(n) {
		i, j := rng.IntN(n), rng.IntN(n)
		if i != j {
			nv[[2]int{min(i, j), max(i, j)}] = fmt.Sprintf("NV%d", 1+rng.IntN(12))
		}
	}
	return generated(tb, n, 32, func(i, j int) string {
		if l, ok := nv[[2]int{min(i, j), max(i, j)}]; ok {
			return l
		}
		if i%groups == j%groups {
			return inner
		}
		return outer
	})
}

// TestKindTablesMatchSearch: a search that uses a kind's precomputed
// tables (idle nodes after Prepare) returns exactly what the search
// without them returns, over every fixture topology, random 12-16 GPU
// topologies, random states, sizes, link requirements and mixes.
func TestKindTablesMatchSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	topos := allTopologies(t)
	for i := range 6 {
		n := memoMinFree + rng.IntN(exactMaxFree-memoMinFree+1)
		topos = append(topos, namedTopology{fmt.Sprintf("random-%d-%d", i, n), randomTopology(t, rng, n)})
	}
	mixes := []*SizeMix{nil, mustSizeMix(map[int]float64{1: 3, 2: 1}), mustSizeMix(map[int]float64{4: 1, 8: 1}), mustSizeMix(map[int]float64{2: 5, 3: 1, 6: 2, 12: 1})}
	links := []topology.Link{topology.LinkNone, topology.LinkNVLink, topology.LinkPHB}
	for _, nt := range topos {
		t.Run(nt.name, func(t *testing.T) {
			Prepare(nt.topo)
			n := nt.topo.Len()
			prepared := n >= memoMinFree && n <= exactMaxFree
			for it := range 120 {
				var used []int
				if it%3 != 0 { // a third idle: the kind tables' case
					for p := range n {
						if rng.IntN(6) == 0 {
							used = append(used, p)
						}
					}
				}
				node := nodeWith("node-a", nt.topo, used...)
				free := n - len(used)
				if free == 0 {
					continue
				}
				req := Request{GPUs: 1 + rng.IntN(min(free, 10)), RequiredLink: links[rng.IntN(len(links))]}
				if it%7 == 0 {
					req.Eligible = make([]bool, n)
					for p := range req.Eligible {
						req.Eligible[p] = rng.IntN(5) != 0
					}
				}
				pol := Policy{Mix: mixes[rng.IntN(len(mixes))]}
				restore := setSearchCaches(false, false)
				want, wantErr := Allocate(node, req, pol)
				restore()
				restore = setSearchCaches(false, true)
				got, gotErr := Allocate(node, req, pol)
				restore()
				if !reflect.DeepEqual(got, want) || (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
					t.Fatalf("used %v, %+v, mix %v: with kind tables %v, %v; search %v, %v", used, req, pol.Mix, got, gotErr, want, wantErr)
				}
			}
			if prepared {
				var l local
				l.load(nt.topo, fullMask(n))
				if kinds.get(&l, false) == nil {
					t.Fatal("Prepare kept no tables for the kind")
				}
			}
		})
	}
}

// TestKindTablesWithin: within[m][j] is the best j-subset of m.
func TestKindTablesWithin(t *testing.T) {
	var l local
	topo := pcie16(t)
	l.load(topo, fullMask(topo.Len()))
	kt := buildKind(&l)
	rng := rand.New(rand.NewPCG(3, 3))
	for range 200 {
		m := uint32(rng.Uint64()) & 0xFFFF
		var want [exactMaxFree + 1]key
		for sub := m; sub != 0; sub = (sub - 1) & m {
			pc := bits.OnesCount32(sub)
			if pc >= 2 {
				want[pc] = max(want[pc], setKey(topo, uint64(sub)))
			}
		}
		got := kt.within[m]
		got[0], got[1] = 0, 0
		if got != want {
			t.Fatalf("within[%016b] = %v, want %v", m, got, want)
		}
	}
}
