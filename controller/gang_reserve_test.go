package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/driver/gang"
)

// TestClosestDomain: the reserved domain is at the Required level, else
// the lowest level with enough GPUs when idle; there the one with the most
// slots now, then the most free GPUs.
func TestClosestDomain(t *testing.T) {
	h := gang.DefaultHierarchy()
	leaf, _ := h.LevelOfKey(gang.LabelLeaf)
	spine, _ := h.LevelOfKey(gang.LabelSpine)
	doms := func(l, s string) []string {
		d := make([]string, h.Cluster()-1)
		d[leaf-1], d[spine-1] = l, s
		return d
	}
	nodes := []gang.Node{
		{Name: "a1", Domains: doms("l1", "s1"), Slots: 1, FreeGPUs: 8, TotalGPUs: 8},
		{Name: "a2", Domains: doms("l1", "s1"), Slots: 0, FreeGPUs: 2, TotalGPUs: 8},
		{Name: "b1", Domains: doms("l2", "s1"), Slots: 1, FreeGPUs: 8, TotalGPUs: 8},
		{Name: "b2", Domains: doms("l2", "s1"), Slots: 1, FreeGPUs: 8, TotalGPUs: 8},
		{Name: "b3", Domains: doms("l2", "s1"), Slots: 0, FreeGPUs: 0, TotalGPUs: 8},
	}
	for _, tc := range []struct {
		name      string
		req       gang.Request
		wantLevel int
		want      []string // nil: no reservation
	}{
		// 3 pods × 8 GPUs: only l2 has 3 nodes; it has 2 slots now.
		{"Required leaf", gang.Request{Pods: 3, GPUsPerPod: 8, Level: leaf, Constraint: gang.Required}, leaf, []string{"b1", "b2", "b3"}},
		// 2 pods: both leaves could hold it idle; l2 has more slots.
		{"Preferred from the node up", gang.Request{Pods: 2, GPUsPerPod: 8, Constraint: gang.Preferred}, leaf, []string{"b1", "b2", "b3"}},
		// 4 pods: no leaf can, the spine can.
		{"spine", gang.Request{Pods: 4, GPUsPerPod: 8, Constraint: gang.Preferred}, spine, []string{"a1", "a2", "b1", "b2", "b3"}},
		// Never fits: a reservation would keep everyone else off a domain
		// (under Preferred, the whole cluster) for ever.
		{"Required leaf larger than every leaf", gang.Request{Pods: 4, GPUsPerPod: 8, Level: leaf, Constraint: gang.Required}, leaf, nil},
		{"Preferred larger than the cluster", gang.Request{Pods: 6, GPUsPerPod: 8, Constraint: gang.Preferred}, h.Cluster(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _, got, ok := closestDomain(h, tc.req, nodes)
			if ok != (tc.want != nil) || l != tc.wantLevel || !got.Equal(sets.New(tc.want...)) {
				t.Errorf("closestDomain = level %d %v ok %v, want level %d %v", l, sets.List(got), ok, tc.wantLevel, tc.want)
			}
		})
	}
}
