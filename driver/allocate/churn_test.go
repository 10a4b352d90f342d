package allocate

import (
	"math/bits"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// allocator is a whole-GPU placement rule under comparison.
type allocator struct {
	name string
	pick func(n *NodeState, k int) []int
}

// firstFit takes the lowest free positions, as a topology-blind allocator
// (kube-scheduler's structured allocator, for one) does.
func firstFit(n *NodeState, k int) []int {
	var out []int
	for m := freeMask(n); m != 0 && len(out) < k; m &= m - 1 {
		out = append(out, bits.TrailingZeros64(m))
	}
	return out
}

// greedyPrim starts at the lowest free GPU and repeatedly adds the free GPU
// with the best link to any GPU already chosen (ties to the lowest
// position), the way topology-aware scheduler extenders grow a set.
func greedyPrim(n *NodeState, k int) []int {
	free := freeMask(n)
	if bits.OnesCount64(free) < k {
		return nil
	}
	set := uint64(1) << bits.TrailingZeros64(free)
	for bits.OnesCount64(set) < k {
		best, bestLink := -1, topology.LinkNone
		for m := free &^ set; m != 0; m &= m - 1 {
			g := bits.TrailingZeros64(m)
			for a := set; a != 0; a &= a - 1 {
				if l := n.Topology.Link(bits.TrailingZeros64(a), g); l > bestLink {
					best, bestLink = g, l
				}
			}
		}
		set |= 1 << best
	}
	return positions(set)
}

func gpulink(n *NodeState, k int) []int {
	r, err := Allocate(n, Request{GPUs: k}, Policy{})
	if err != nil {
		return nil
	}
	return r.GPUs
}

// op allocates GPUs whole GPUs under id, or (GPUs == 0) frees id.
type op struct {
	id   string
	gpus int
}

// runChurn plays ops and returns the weakest link of the last allocation.
func runChurn(t *testing.T, topo *topology.Topology, a allocator, ops []op) topology.Link {
	t.Helper()
	node := nodeWith("node-a", topo)
	live := map[string]Result{}
	var last Result
	for i, o := range ops {
		if o.gpus == 0 {
			if err := node.Release(Request{GPUs: len(live[o.id].GPUs)}, live[o.id]); err != nil {
				t.Fatalf("%s: op %d: %v", a.name, i, err)
			}
			delete(live, o.id)
			continue
		}
		set := a.pick(node, o.gpus)
		if len(set) != o.gpus {
			t.Fatalf("%s: op %d: no %d GPUs", a.name, i, o.gpus)
		}
		last = Result{Node: "node-a", GPUs: set, WeakestLink: setKey(topo, maskOf(set)).link()}
		if err := node.Commit(Request{GPUs: o.gpus}, last); err != nil {
			t.Fatalf("%s: op %d: %v", a.name, i, err)
		}
		live[o.id] = last
	}
	return last.WeakestLink
}

// TestChurnDoesNotStrand replays job sequences on which first-fit and
// greedy growth leave the last job on slow links while a better earlier
// choice keeps a fast set for it.
func TestChurnDoesNotStrand(t *testing.T) {
	baselines := []allocator{{"first-fit", firstFit}, {"greedy", greedyPrim}}
	for _, tc := range []struct {
		name string
		topo func(testing.TB) *topology.Topology
		ops  []op
		want topology.Link
	}{
		{
			name: "v100: a single GPU must not break both quads' chances",
			topo: v100, ops: []op{{"a", 1}, {"b", 4}}, want: nv1,
		},
		{
			name: "v100: two pairs in one quad, then a quad after one leaves",
			topo: v100, ops: []op{{"a", 2}, {"b", 2}, {"a", 0}, {"c", 4}}, want: nv1,
		},
		{
			name: "p40: a triple after a single GPU stays on one switch",
			topo: p40, ops: []op{{"a", 1}, {"b", 3}}, want: topology.LinkPIX,
		},
		{
			name: "nvbridge: singles fill broken pairs, a pair stays bridged",
			topo: nvbridge, ops: []op{{"a", 2}, {"b", 1}, {"a", 0}, {"c", 1}, {"d", 2}}, want: nv4,
		},
		{
			name: "pcie-16: quads stay on one switch through churn",
			topo: pcie16,
			ops:  []op{{"a", 2}, {"b", 1}, {"c", 2}, {"a", 0}, {"d", 1}, {"e", 4}},
			want: topology.LinkPIX,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := tc.topo(t)
			got := runChurn(t, topo, allocator{"gpulink", gpulink}, tc.ops)
			if got != tc.want {
				t.Fatalf("gpulink: last job weakest link %s, want %s", got, tc.want)
			}
			for _, b := range baselines {
				if bl := runChurn(t, topo, b, tc.ops); bl >= got {
					t.Errorf("%s: last job weakest link %s, want worse than gpulink's %s (the sequence no longer shows the difference)", b.name, bl, got)
				}
			}
		})
	}
}
