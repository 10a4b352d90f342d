package gang

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// span is the highest level a set of nodes spans: 0 for one node, else the
// lowest label level all of them share a non-empty value of, else the
// cluster. It is the definition Place's Level must meet.
func span(h *Hierarchy, nodes []Node, used []int) int {
	distinct := map[int]bool{}
	for _, i := range used {
		distinct[i] = true
	}
	if len(distinct) <= 1 {
		return 0
	}
	for lv := 1; lv < h.Cluster(); lv++ {
		v := nodes[used[0]].domain(lv)
		same := v != ""
		for _, i := range used {
			if nodes[i].domain(lv) != v {
				same = false
				break
			}
		}
		if same {
			return lv
		}
	}
	return h.Cluster()
}

// bruteForce enumerates every way to put k pods on nodes within slots and
// returns the lowest level any of them spans (-1: none holds k pods).
func bruteForce(h *Hierarchy, nodes []Node, k int) int {
	best := -1
	counts := make([]int, len(nodes))
	var rec func(i, left int)
	rec = func(i, left int) {
		if left == 0 {
			var used []int
			for n, c := range counts {
				for range c {
					used = append(used, n)
				}
			}
			if lv := span(h, nodes, used); best < 0 || lv < best {
				best = lv
			}
			return
		}
		if i == len(nodes) {
			return
		}
		for c := min(left, nodes[i].Slots); c >= 0; c-- {
			counts[i] = c
			rec(i+1, left-c)
		}
		counts[i] = 0
	}
	rec(0, k)
	return best
}

// randomCluster draws up to 7 nodes over a three-key hierarchy with few
// values (so domains collide) and missing labels, not always nested.
func randomCluster(r *rand.Rand) []Node {
	n := 1 + r.IntN(7)
	nodes := make([]Node, n)
	for i := range nodes {
		d := make([]string, 3)
		for lv := range d {
			if r.IntN(5) > 0 {
				d[lv] = fmt.Sprintf("d%d-%d", lv, r.IntN(3-lv))
			}
		}
		free := r.IntN(9)
		nodes[i] = Node{Name: fmt.Sprintf("n%d", i), Domains: d, Slots: min(r.IntN(4), free), FreeGPUs: free, TotalGPUs: 8}
	}
	return nodes
}

// TestPlaceMatchesBruteForce checks, on random small clusters, that Place
// never places a partial gang, never exceeds a node's slots, reports the
// level its nodes really span, places the most pods any placement can
// (within MinCount..Pods and the Required level) and does so at the
// lowest level brute force finds for that count.
func TestPlaceMatchesBruteForce(t *testing.T) {
	h, err := NewHierarchyFromKeys([]string{"example.com/a", "example.com/b", "example.com/c"})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(31, 1))
	placed, refused := 0, 0
	for iter := range 3000 {
		nodes := randomCluster(r)
		req := Request{Name: "g", Pods: 1 + r.IntN(6), GPUsPerPod: 1 + r.IntN(8)}
		req.MinCount = r.IntN(req.Pods + 1)
		for range r.IntN(4) { // a demand must never change the level or the count
			req.Demand = append(req.Demand, Shape{Pods: 1 + r.IntN(8), GPUsPerPod: 1 + r.IntN(8), Count: 1 + r.IntN(3)})
		}
		switch r.IntN(3) {
		case 0:
			req.Constraint, req.Level = Required, r.IntN(h.Cluster()+1)
		case 1:
			req.Constraint, req.Level = Preferred, r.IntN(h.Cluster()+1)
		}
		maxLevel := h.Cluster()
		if req.Constraint == Required {
			maxLevel = req.Level
		}
		minCount := req.MinCount
		if minCount == 0 {
			minCount = req.Pods
		}
		// The most pods placeable within maxLevel, and that count's level.
		wantK, wantLevel := 0, -1
		for k := req.Pods; k >= minCount; k-- {
			if lv := bruteForce(h, nodes, k); lv >= 0 && lv <= maxLevel {
				wantK, wantLevel = k, lv
				break
			}
		}
		p, err := Place(h, req, nodes)
		ctx := fmt.Sprintf("iter %d: req %+v nodes %+v", iter, req, nodes)
		if wantK == 0 {
			var ue *UnplaceableError
			if !errors.As(err, &ue) {
				t.Fatalf("%s: got %v, %v; want UnplaceableError", ctx, p, err)
			}
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v; brute force places %d pods at level %d", ctx, err, wantK, wantLevel)
		}
		placed++
		if len(p.Nodes) != wantK {
			t.Fatalf("%s: placed %d pods, want %d", ctx, len(p.Nodes), wantK)
		}
		idx := map[string]int{}
		for i, n := range nodes {
			idx[n.Name] = i
		}
		var used []int
		for name, c := range p.PodsOn() {
			i, ok := idx[name]
			if !ok {
				t.Fatalf("%s: unknown node %q", ctx, name)
			}
			if c > nodes[i].Slots {
				t.Fatalf("%s: %d pods on %s, slots %d", ctx, c, name, nodes[i].Slots)
			}
		}
		for _, name := range p.Nodes {
			used = append(used, idx[name])
		}
		if got := span(h, nodes, used); got != p.Level {
			t.Fatalf("%s: reports level %d, its nodes span %d", ctx, p.Level, got)
		}
		if p.Level != wantLevel {
			t.Fatalf("%s: level %d, brute force %d", ctx, p.Level, wantLevel)
		}
		if p.Relaxed != (req.Constraint == Preferred && p.Level > req.Level) {
			t.Fatalf("%s: relaxed %v at level %d", ctx, p.Relaxed, p.Level)
		}
		again, err := Place(h, req, nodes)
		if err != nil || fmt.Sprint(again) != fmt.Sprint(p) {
			t.Fatalf("%s: not deterministic: %v then %v, %v", ctx, p, again, err)
		}
	}
	t.Logf("%d placed, %d refused", placed, refused)
	if placed < 500 || refused < 100 {
		t.Fatalf("draws too one-sided: %d placed, %d refused", placed, refused)
	}
}
