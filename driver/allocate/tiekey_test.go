package allocate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestTopologyTieKeyKeepsDomainsContiguous sorts the keys of nodes with
// random names in a zone/spine/leaf hierarchy whose domain names include
// prefixes of one another ("l1", "l1-b", "l10") and checks that every
// domain's nodes are adjacent at every level.
func TestTopologyTieKeyKeepsDomainsContiguous(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	zones, spines, leaves := []string{"z", "z-b", ""}, []string{"s1", "s1-b", "s10"}, []string{"l1", "l1-b", "l10", ""}
	type node struct {
		key     string
		domains []string
	}
	var nodes []node
	for i := range 300 {
		d := []string{zones[rng.IntN(len(zones))], spines[rng.IntN(len(spines))], leaves[rng.IntN(len(leaves))]}
		// d is widest first, for the check below; the key takes the
		// domains tightest first.
		nodes = append(nodes, node{TopologyTieKey([]string{d[2], d[1], d[0]}, fmt.Sprintf("n-%x", rng.Uint32()^uint32(i))), d})
	}
	slices.SortFunc(nodes, func(a, b node) int { return strings.Compare(a.key, b.key) })
	for level := 1; level <= 3; level++ {
		// A domain at this level is the tuple of the node's first level
		// domains; once left, it must not come back.
		done := map[string]bool{}
		prev := ""
		for i, n := range nodes {
			id := fmt.Sprintf("%q", n.domains[:level])
			if id != prev {
				if done[id] {
					t.Fatalf("level %d: domain %s resumes at node %d after other domains", level, id, i)
				}
				if prev != "" {
					done[prev] = true
				}
				prev = id
			}
		}
	}
}

// TestChooseNodeBreaksTiesByTieKey: equal nodes are ranked by TieKey where
// set, else by name.
func TestChooseNodeBreaksTiesByTieKey(t *testing.T) {
	a := &NodeState{Name: "a", TieKey: TopologyTieKey([]string{"l2"}, "a"), Topology: v100(t)}
	b := &NodeState{Name: "b", TieKey: TopologyTieKey([]string{"l1"}, "b"), Topology: v100(t)}
	got, err := ChooseNode([]*NodeState{a, b}, Request{GPUs: 2}, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != "b" {
		t.Errorf("ChooseNode picked %s, want b (leaf l1 before l2)", got.Node)
	}
	a.TieKey, b.TieKey = "", ""
	if got, err = ChooseNode([]*NodeState{b, a}, Request{GPUs: 2}, Policy{}); err != nil || got.Node != "a" {
		t.Errorf("without tie keys ChooseNode picked %s (%v), want a by name", got.Node, err)
	}
	// A share ranks the same way.
	a.TieKey, b.TieKey = TopologyTieKey([]string{"l2"}, "a"), TopologyTieKey([]string{"l1"}, "b")
	if got, err = ChooseNode([]*NodeState{a, b}, Request{Share: &ShareRequest{MemoryBytes: 1 << 30, Cores: 10}}, Policy{}); err != nil || got.Node != "b" {
		t.Errorf("share: ChooseNode picked %s (%v), want b", got.Node, err)
	}
}
