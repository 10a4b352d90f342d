package gang

import (
	"slices"
	"testing"
)

// applyPlacement applies a placement to nodes: each pod takes g GPUs of its node.
func applyPlacement(nodes []Node, p *Placement, g int) {
	for name, pods := range p.PodsOn() {
		i := slices.IndexFunc(nodes, func(n Node) bool { return n.Name == name })
		nodes[i].FreeGPUs -= pods * g
		nodes[i].Slots = nodes[i].FreeGPUs / g
	}
}

// TestPlaceRelaxedTakesFragments: a gang that no domain of its minimal
// level holds now spans several of them (under Preferred, or within a
// Required level above its minimal one). It takes the fragments the other
// jobs left first and the best fit last, so that the domain closest to
// holding a gang of its size whole stays so: the next gang of that size
// lands on its minimal level. Using the largest first (the fewest domains)
// would have cut into that domain and sent the next gang across domains
// too.
func TestPlaceRelaxedTakesFragments(t *testing.T) {
	h := DefaultHierarchy()
	cases := []struct {
		name    string
		cluster cluster
		used    map[int]int
		first   Request
		// wantFirst are the domains (at the minimal level) the first gang
		// spans and the pods in each.
		wantFirst map[string]int
		// second lands on its minimal level, wantLevel, in wantDomain.
		second                Request
		wantLevel, wantDomain string
	}{{
		name:    "superpod: 32 pods over leaves with 30, 30, 1 and 1 free nodes",
		cluster: superPODCluster(256),
		// leaf-0 and leaf-1 have 30 free nodes, leaf-2 and leaf-3 one, the
		// other four leaves none.
		used:      busy(busy(busy(busy(busy(map[int]int{}, 0, 2), 32, 34), 64, 95), 96, 127), 128, 256),
		first:     Request{Name: "relaxed", Pods: 32, GPUsPerPod: 8},
		wantFirst: map[string]int{"leaf-2": 1, "leaf-3": 1, "leaf-0": 30},
		second:    Request{Name: "next", Pods: 30, GPUsPerPod: 8},
		wantLevel: "leaf", wantDomain: "leaf-1",
	}, {
		name:    "superpod: Required spine, 32 pods, no leaf free",
		cluster: superPODCluster(256),
		used:    busy(busy(busy(busy(busy(map[int]int{}, 0, 2), 32, 34), 64, 95), 96, 127), 128, 256),
		first:   Request{Name: "required", Pods: 32, GPUsPerPod: 8, Level: 4, Constraint: Required},
		// The same placement: within the Required spine, the leaves are
		// at and above the gang's minimal level.
		wantFirst: map[string]int{"leaf-2": 1, "leaf-3": 1, "leaf-0": 30},
		second:    Request{Name: "next", Pods: 30, GPUsPerPod: 8, Level: 3, Constraint: Required},
		wantLevel: "leaf", wantDomain: "leaf-1",
	}, {
		name:    "nvl72: 18 pods over cliques with 16, 16, 1 and 1 free nodes",
		cluster: nvl72Cluster(72),
		// cluster-uuid.0 and .1 have 16 free nodes, .2 and .3 one.
		used:      busy(busy(busy(busy(map[int]int{}, 0, 2), 18, 20), 36, 53), 54, 71),
		first:     Request{Name: "relaxed", Pods: 18, GPUsPerPod: 8, Level: 1, Constraint: Preferred},
		wantFirst: map[string]int{"cluster-uuid.2": 1, "cluster-uuid.3": 1, "cluster-uuid.0": 16},
		second:    Request{Name: "next", Pods: 16, GPUsPerPod: 8, Level: 1, Constraint: Required},
		wantLevel: "clique", wantDomain: "cluster-uuid.1",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := tc.cluster.build(tc.used, 8)
			p, err := Place(h, tc.first, nodes)
			if err != nil {
				t.Fatal(err)
			}
			minimal := 3 // leaf
			if tc.cluster.name == "nvl72" {
				minimal = 1 // clique
			}
			got := map[string]int{}
			for name, pods := range p.PodsOn() {
				i := slices.IndexFunc(nodes, func(n Node) bool { return n.Name == name })
				got[nodes[i].domain(minimal)] += pods
			}
			if len(got) != len(tc.wantFirst) {
				t.Fatalf("first gang spans %v, want %v", got, tc.wantFirst)
			}
			for d, n := range tc.wantFirst {
				if got[d] != n {
					t.Fatalf("first gang spans %v, want %v", got, tc.wantFirst)
				}
			}
			applyPlacement(nodes, p, 8)
			q, err := Place(h, tc.second, nodes)
			if err != nil {
				t.Fatalf("second gang: %v; the fragments-first fill kept %s whole for it", err, tc.wantDomain)
			}
			if q.LevelName != tc.wantLevel || q.Domain != tc.wantDomain {
				t.Fatalf("second gang on %s %s, want %s %s (its minimal level)", q.LevelName, q.Domain, tc.wantLevel, tc.wantDomain)
			}
		})
	}
}
