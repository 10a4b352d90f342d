package gang

import (
	"errors"
	"fmt"
	"testing"
)

// superPOD builds 8-GPU nodes, 32 per leaf, 8 leaves per spine: DGX
// SuperPOD-style scalable units. used[i] GPUs are taken on node i.
func superPOD(nodes int, used map[int]int, gpusPerPod int) []Node {
	out := make([]Node, nodes)
	for i := range out {
		free := 8 - used[i]
		out[i] = Node{
			Name:      fmt.Sprintf("n%04d", i),
			Domains:   []string{"", "", fmt.Sprintf("leaf-%d", i/32), fmt.Sprintf("spine-%d", i/256), "zone-a"},
			Slots:     free / gpusPerPod,
			FreeGPUs:  free,
			TotalGPUs: 8,
		}
	}
	return out
}

func TestPlaceSmoke(t *testing.T) {
	h := DefaultHierarchy()
	used := map[int]int{}
	for i := 0; i < 29; i++ {
		used[i] = 8 // leaf-0 has 3 free nodes
	}
	nodes := superPOD(64, used, 8)
	p, err := Place(h, Request{Name: "train-a", Pods: 4, GPUsPerPod: 8, Level: 3, Constraint: Preferred}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if p.LevelName != "leaf" || p.Domain != "leaf-1" || len(p.Nodes) != 4 {
		t.Fatalf("got %+v, want 4 pods in leaf-1", p)
	}
	for i := 32; i < 64; i++ {
		used[i] = 8 - 8*boolInt(i < 35) // leaf-1 has 3 free nodes as well
	}
	nodes = superPOD(64, used, 8)
	_, err = Place(h, Request{Name: "train-a", Pods: 4, GPUsPerPod: 8, Level: 3, Constraint: Required}, nodes)
	var ue *UnplaceableError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want UnplaceableError", err)
	}
	if want := "gang train-a: 4 pods × 8 GPUs: only 3 fit in one leaf; 2 leaves would fit under Preferred"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	p, err = Place(h, Request{Name: "train-a", Pods: 4, GPUsPerPod: 8, Level: 3}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Relaxed || p.LevelName != "spine" {
		t.Fatalf("got %+v, want relaxed to spine", p)
	}
	t.Log(p.Note)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
