package gang

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestPlaceTable(t *testing.T) {
	h := DefaultHierarchy()
	const spine = 4
	cases := []struct {
		name    string
		cluster cluster
		used    map[int]int
		req     Request
		// wantLevel and wantDomain: the level spanned and its domain.
		wantLevel  string
		wantDomain string
		// wantNodes, when set, are the exact nodes (sorted); wantIn, when
		// set, a predicate every chosen node index must meet.
		wantNodes []string
		wantIn    func(i int) bool
		wantNote  string
		wantErr   string
	}{{
		name:      "superpod: 4 pods fit one leaf, the busiest leaf that fits",
		cluster:   superPODCluster(2048),
		used:      busy(busy(map[int]int{}, 0, 30), 32, 60), // leaf-0 has 2 free, leaf-1 4
		req:       Request{Name: "train-a", Pods: 4, GPUsPerPod: 8},
		wantLevel: "leaf", wantDomain: "leaf-1",
		wantNodes: []string{"n0060", "n0061", "n0062", "n0063"},
	}, {
		name:      "superpod: 64 pods span a spine, two whole leaves, the busiest spine first",
		cluster:   superPODCluster(2048),
		used:      busy(map[int]int{}, 256, 256+32*6), // spine-1 has 2 leaves free
		req:       Request{Name: "train-b", Pods: 64, GPUsPerPod: 8},
		wantLevel: "spine", wantDomain: "spine-1",
		wantIn: func(i int) bool { return i >= 256+32*6 && i < 512 },
	}, {
		name:      "superpod: 40 pods finish the partly used leaf and keep the others whole",
		cluster:   superPODCluster(256),
		used:      busy(map[int]int{}, 0, 24), // leaf-0 has 8 free
		req:       Request{Name: "train-c", Pods: 40, GPUsPerPod: 8},
		wantLevel: "spine", wantDomain: "spine-0",
		wantIn: func(i int) bool { return i >= 24 && i < 64 },
	}, {
		name:      "superpod: 1 pod of 2 GPUs goes to the node with 2 free in the busiest leaf",
		cluster:   superPODCluster(128),
		used:      map[int]int{5: 6, 40: 6, 41: 8, 42: 8},
		req:       Request{Name: "single", Pods: 1, GPUsPerPod: 2},
		wantLevel: "node", wantDomain: "n0040",
		wantNodes: []string{"n0040"},
	}, {
		name:      "superpod: 4 pods of 2 GPUs fit one node with 8 free",
		cluster:   superPODCluster(64),
		used:      map[int]int{3: 2},
		req:       Request{Name: "small", Pods: 4, GPUsPerPod: 2},
		wantLevel: "node",
		wantIn:    func(i int) bool { return i != 3 },
	}, {
		name:    "superpod: Required leaf, 3 fit: the issue's message",
		cluster: superPODCluster(64),
		used:    busy(busy(map[int]int{}, 0, 29), 32, 61),
		req:     Request{Name: "train-a", Pods: 4, GPUsPerPod: 8, Level: 3, Constraint: Required},
		wantErr: "gang train-a: 4 pods × 8 GPUs: only 3 fit in one leaf; 2 leaves would fit under Preferred",
	}, {
		name:      "superpod: Preferred leaf, 3 fit: spans 2 leaves with a note",
		cluster:   superPODCluster(64),
		used:      busy(busy(map[int]int{}, 0, 29), 32, 61),
		req:       Request{Name: "train-a", Pods: 4, GPUsPerPod: 8, Level: 3, Constraint: Preferred},
		wantLevel: "spine", wantDomain: "spine-0",
		wantNote: "gang train-a: 4 pods × 8 GPUs: only 3 fit in one leaf; placed across 2 leaves of one spine",
	}, {
		name:    "superpod: more pods than the cluster holds",
		cluster: superPODCluster(64),
		used:    busy(map[int]int{}, 0, 60),
		req:     Request{Name: "big", Pods: 8, GPUsPerPod: 8},
		wantErr: "gang big: 8 pods × 8 GPUs: only 4 fit in the cluster",
	}, {
		name:      "superpod: minCount: 6 of 8 under Required leaf",
		cluster:   superPODCluster(64),
		used:      busy(busy(map[int]int{}, 0, 26), 32, 58),
		req:       Request{Name: "elastic", Pods: 8, MinCount: 5, GPUsPerPod: 8, Level: 3, Constraint: Required},
		wantLevel: "leaf", wantDomain: "leaf-0",
		wantIn: func(i int) bool { return i >= 26 && i < 32 },
	}, {
		name:      "superpod: minCount: all 8 across leaves under Preferred",
		cluster:   superPODCluster(64),
		used:      busy(busy(map[int]int{}, 0, 26), 32, 58),
		req:       Request{Name: "elastic", Pods: 8, MinCount: 5, GPUsPerPod: 8, Level: 3, Constraint: Preferred},
		wantLevel: "spine",
		wantNote:  "gang elastic: 8 pods (at least 5) × 8 GPUs: only 6 fit in one leaf; placed across 2 leaves of one spine",
	}, {
		name:      "nvl72: 18 pods fill one clique, the busiest leaf's",
		cluster:   nvl72Cluster(2016),
		used:      busy(map[int]int{}, 72, 72+18), // leaf-1 has a busy clique
		req:       Request{Name: "nvl", Pods: 18, GPUsPerPod: 8},
		wantLevel: "clique", wantDomain: "cluster-uuid.5",
	}, {
		name:      "nvl72: 16 pods, the clique with 16 free over idle ones",
		cluster:   nvl72Cluster(2016),
		used:      map[int]int{1000: 8, 1001: 8},
		req:       Request{Name: "nvl", Pods: 16, GPUsPerPod: 8},
		wantLevel: "clique", wantDomain: "cluster-uuid.55",
	}, {
		name:    "nvl72: Required clique for 20 pods",
		cluster: nvl72Cluster(2016),
		req:     Request{Name: "nvl-big", Pods: 20, GPUsPerPod: 8, Level: 1, Constraint: Required},
		wantErr: "gang nvl-big: 20 pods × 8 GPUs: only 18 fit in one clique; 2 cliques would fit under Preferred",
	}, {
		name:      "nvl72: 20 pods: one leaf, one whole clique and 2 nodes of the next",
		cluster:   nvl72Cluster(144),
		req:       Request{Name: "nvl-big", Pods: 20, GPUsPerPod: 8},
		wantLevel: "leaf", wantDomain: "leaf-0",
		wantIn: func(i int) bool { return i < 20 },
	}, {
		name:      "nvl72: 100 pods span leaves of one spine",
		cluster:   nvl72Cluster(2016),
		req:       Request{Name: "huge", Pods: 100, GPUsPerPod: 8},
		wantLevel: "spine",
	}, {
		name:      "nodes without labels are alone at every level",
		cluster:   cluster{name: "bare", nodes: 6, domains: func(int) []string { return nil }},
		req:       Request{Name: "bare", Pods: 3, GPUsPerPod: 8},
		wantLevel: "cluster",
	}}
	_ = spine
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := tc.cluster.build(tc.used, tc.req.GPUsPerPod)
			p, err := Place(h, tc.req, nodes)
			if tc.wantErr != "" {
				var ue *UnplaceableError
				if !errors.As(err, &ue) || err.Error() != tc.wantErr {
					t.Fatalf("got %v, %v; want error %q", p, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Nodes) < max(tc.req.MinCount, 1) || len(p.Nodes) > tc.req.Pods {
				t.Fatalf("placed %d pods, request %+v", len(p.Nodes), tc.req)
			}
			if p.LevelName != tc.wantLevel || tc.wantDomain != "" && p.Domain != tc.wantDomain {
				t.Fatalf("level %s domain %s, want %s %s", p.LevelName, p.Domain, tc.wantLevel, tc.wantDomain)
			}
			if tc.wantNodes != nil {
				got := slices.Clone(p.Nodes)
				slices.Sort(got)
				if !slices.Equal(got, tc.wantNodes) {
					t.Fatalf("nodes %v, want %v", got, tc.wantNodes)
				}
			}
			for _, n := range p.Nodes {
				var i int
				if _, err := fmt.Sscanf(n, "n%d", &i); err != nil {
					t.Fatal(err)
				}
				if tc.wantIn != nil && !tc.wantIn(i) {
					t.Fatalf("node %s not among the wanted nodes: %v", n, p.Nodes)
				}
			}
			if p.Note != tc.wantNote || p.Relaxed != (tc.wantNote != "") {
				t.Fatalf("note %q relaxed %v, want %q", p.Note, p.Relaxed, tc.wantNote)
			}
		})
	}
}

func TestPlaceRailAlignment(t *testing.T) {
	h := DefaultHierarchy()
	nodes := superPODCluster(4).build(nil, 1)
	// rail 0 has room on every node, rail 1 on two nodes only; rail 1 also
	// fits the gang on one node, which wins (lower level).
	for i := range nodes {
		nodes[i].AlignedSlots = map[string]int{"rail=0": 1}
	}
	nodes[2].AlignedSlots["rail=1"] = 4
	p, err := Place(h, Request{Name: "r", Pods: 4, GPUsPerPod: 1, AlignRails: true}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if p.Alignment != "rail=1" || p.LevelName != "node" || p.Domain != "n0002" {
		t.Fatalf("got %+v, want 4 pods on n0002 with rail=1", p)
	}
	nodes[2].AlignedSlots["rail=1"] = 2
	p, err = Place(h, Request{Name: "r", Pods: 4, GPUsPerPod: 1, AlignRails: true}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if p.Alignment != "rail=0" || p.LevelName != "leaf" || len(p.PodsOn()) != 4 {
		t.Fatalf("got %+v, want one pod per node with rail=0", p)
	}
	for i := range nodes {
		nodes[i].AlignedSlots = nil
	}
	_, err = Place(h, Request{Name: "r", Pods: 1, GPUsPerPod: 1, AlignRails: true}, nodes)
	if want := "gang r: 1 pods × 1 GPUs: none fit in the cluster"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestPlaceInvalid(t *testing.T) {
	h := DefaultHierarchy()
	ok := superPODCluster(2).build(nil, 8)
	cases := []struct {
		name  string
		req   Request
		nodes []Node
		want  string
	}{
		{"no pods", Request{Name: "g"}, ok, "pods 0"},
		{"minCount above pods", Request{Name: "g", Pods: 2, MinCount: 3}, ok, "minCount 3"},
		{"level above the cluster", Request{Name: "g", Pods: 1, Level: 7}, ok, "level 7"},
		{"unknown constraint", Request{Name: "g", Pods: 1, Constraint: "Maybe"}, ok, `constraint "Maybe"`},
		{"duplicate node", Request{Name: "g", Pods: 1}, []Node{ok[0], ok[0]}, "appears twice"},
		{"negative slots", Request{Name: "g", Pods: 1}, []Node{{Name: "x", Slots: -1}}, "slots -1"},
		{"too many domains", Request{Name: "g", Pods: 1}, []Node{{Name: "x", Domains: make([]string, 6)}}, "6 domains"},
	}
	for _, tc := range cases {
		_, err := Place(h, tc.req, tc.nodes)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrInvalid naming %q", tc.name, err, tc.want)
		}
	}
}

func TestHierarchy(t *testing.T) {
	h := DefaultHierarchy()
	var names []string
	for lv := 0; lv <= h.Cluster(); lv++ {
		names = append(names, h.Name(lv)+"/"+h.Plural(lv))
	}
	if got := strings.Join(names, " "); got != "node/nodes clique/cliques accelerator/accelerators leaf/leaves spine/spines zone/zones cluster/clusters" {
		t.Fatalf("levels %s", got)
	}
	if lv, ok := h.LevelOfKey(LabelLeaf); !ok || lv != 3 {
		t.Fatalf("LevelOfKey(leaf) = %d, %v", lv, ok)
	}
	if lv, ok := h.LevelOfKey(LabelHostname); !ok || lv != 0 {
		t.Fatalf("LevelOfKey(hostname) = %d, %v", lv, ok)
	}
	if _, ok := h.LevelOfKey("example.com/rack"); ok {
		t.Fatal("LevelOfKey found an unknown key")
	}
	if lv, ok := h.LevelOfName("spine"); !ok || lv != 4 {
		t.Fatalf("LevelOfName(spine) = %d, %v", lv, ok)
	}
	d := h.Domains(map[string]string{LabelLeaf: "l1", LabelZone: "z"})
	if !slices.Equal(d, []string{"", "", "l1", "", "z"}) {
		t.Fatalf("Domains = %q", d)
	}
	for _, bad := range [][]string{{""}, {"a", "a"}, {LabelHostname}} {
		if _, err := NewHierarchyFromKeys(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewHierarchyFromKeys(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestPlaceDemand: a gang of 4 pods × 8 GPUs and two racks that fit it
// equally well (6 free nodes and 4 free GPUs beside each), the GPUs
// beside free as 2 + 2 on one rack and 4 on the other. Without a demand
// the name decides; with gangs of 5 pods × 4 GPUs in the demand (one
// rack's worth), the rack whose leftover still holds one (2 idle nodes and
// the node with 4 free: 5 pods) wins.
func TestPlaceDemand(t *testing.T) {
	h, err := NewHierarchyFromKeys([]string{"example.com/rack"})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []Node
	add := func(rack string, free ...int) {
		for _, f := range free {
			nodes = append(nodes, Node{Name: fmt.Sprintf("%s-%d", rack, len(nodes)), Domains: []string{rack}, Slots: f / 8, FreeGPUs: f, TotalGPUs: 8})
		}
	}
	add("rack-a", 8, 8, 8, 8, 8, 8, 2, 2)
	add("rack-b", 8, 8, 8, 8, 8, 8, 4, 0)
	req := Request{Name: "g", Pods: 4, GPUsPerPod: 8}
	p, err := Place(h, req, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if p.Domain != "rack-a" {
		t.Fatalf("without demand: %s, want rack-a (the name)", p.Domain)
	}
	req.Demand = []Shape{{Pods: 5, GPUsPerPod: 4, Count: 10}, {Pods: 4, GPUsPerPod: 8, Count: 1}}
	if p, err = Place(h, req, nodes); err != nil || p.Domain != "rack-b" {
		t.Fatalf("with demand: %v, %v; want rack-b, which keeps a gang of 5 pods × 4 GPUs placeable", p, err)
	}
	// Best fit comes first: a tighter rack wins whatever the demand.
	nodes[5].FreeGPUs, nodes[5].Slots = 0, 0
	if p, err = Place(h, req, nodes); err != nil || p.Domain != "rack-a" {
		t.Fatalf("tighter rack-a: %v, %v; want rack-a", p, err)
	}
	_, err = Place(h, Request{Name: "g", Pods: 1, Demand: []Shape{{Pods: 0, Count: 1}}}, nodes)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "demand[0]") {
		t.Fatalf("invalid demand: %v", err)
	}
}
