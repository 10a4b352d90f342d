package allocate

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func TestChooseNode(t *testing.T) {
	type nodeSpec struct {
		name string
		topo func(testing.TB) *topology.Topology
		used []int
	}
	excl := func(ps ...int) []int { return ps }
	for _, tc := range []struct {
		name     string
		nodes    []nodeSpec
		req      Request
		pol      Policy
		wantNode string
		wantGPUs []int
		wantErr  string
	}{
		{
			name: "better link class wins over binpack",
			nodes: []nodeSpec{
				{"p40", p40, excl(0)},
				{"v100", v100, nil},
			},
			req: Request{GPUs: 4}, wantNode: "v100", wantGPUs: []int{0, 1, 2, 3},
		},
		{
			name: "binpack prefers the busier node of equal link quality",
			nodes: []nodeSpec{
				{"a", v100, nil},
				{"b", v100, excl(4, 5)},
				{"c", v100, excl(4)},
			},
			req: Request{GPUs: 4}, wantNode: "b", wantGPUs: []int{0, 1, 2, 3},
		},
		{
			name: "spread prefers the emptier node of equal link quality",
			nodes: []nodeSpec{
				{"b", v100, excl(4, 5)},
				{"c", v100, excl(4)},
				{"a", v100, nil},
			},
			req: Request{GPUs: 4}, pol: Policy{Node: Spread}, wantNode: "a", wantGPUs: []int{0, 1, 2, 3},
		},
		{
			name: "ties go to the lowest name",
			nodes: []nodeSpec{
				{"z", v100, excl(7)},
				{"m", v100, excl(6)},
			},
			// Both nodes keep the NVLink quad {0,1,2,3} by taking an NV2
			// pair from the broken one.
			req: Request{GPUs: 2}, wantNode: "m", wantGPUs: []int{4, 5},
		},
		{
			name: "one GPU goes to the busiest node",
			nodes: []nodeSpec{
				{"a", dgxA100, nil},
				{"b", dgxA100, excl(0, 1, 2, 3, 4, 5)},
				{"c", dgxA100, excl(0, 1, 2)},
			},
			req: Request{GPUs: 1}, wantNode: "b", wantGPUs: []int{6},
		},
		{
			name: "required link skips nodes that cannot meet it",
			nodes: []nodeSpec{
				{"a", v100, excl(0, 4)},
				{"b", p40, nil},
				{"c", nvbridge, excl(0, 2, 4, 6)},
			},
			// On a, {5,6} leaves the better connected quad {1,2,3,7}.
			req: Request{GPUs: 2, RequiredLink: topology.LinkNVLink}, wantNode: "a", wantGPUs: []int{5, 6},
		},
		{
			name: "nothing has enough GPUs",
			nodes: []nodeSpec{
				{"a", pcie4, excl(0, 1)},
				{"b", pcie4, excl(0, 1, 2)},
			},
			req: Request{GPUs: 3}, wantErr: "no node has 3 free GPUs (most: a with 2 of 4)",
		},
		{
			name: "nothing has enough eligible GPUs",
			nodes: []nodeSpec{
				{"a", pcie4, nil},
				{"b", pcie4, excl(0)},
			},
			req:     Request{GPUs: 3, Eligible: []bool{true, true, false, false}},
			wantErr: "no node has 3 eligible free GPUs (most: a with 2 of 4)",
		},
		{
			name: "eligibility per node",
			nodes: []nodeSpec{
				{"a", v100, nil},
				{"b", pcie4, nil},
				{"c", dgxA100, nil},
			},
			req: Request{GPUs: 2, EligibleByNode: map[string][]bool{
				"a": {false, false, false, false, true, true, false, true},
				"b": {true, true, true, true},
			}},
			// 4-5 and 4-7 are both NV2; 4-7 leaves 5-6, an NV2 pair, for
			// when the node's other GPUs are free again (criterion 3d),
			// where 4-5 would leave 6 and 7 with NV2 links across only.
			wantNode: "a", wantGPUs: []int{4, 7},
		},
		{
			name: "no node has enough GPUs eligible per node",
			nodes: []nodeSpec{
				{"a", v100, nil},
				{"b", pcie4, nil},
			},
			req:     Request{GPUs: 2, EligibleByNode: map[string][]bool{"b": {false, false, true, false}}},
			wantErr: "no node has 2 eligible free GPUs (most: b with 1 of 4)",
		},
		{
			name: "nothing meets the required link",
			nodes: []nodeSpec{
				{"a", v100, excl(0, 4)},
				{"b", p40, nil},
			},
			req:     Request{GPUs: 4, RequiredLink: topology.LinkNVLink},
			wantErr: "no node has 4 free GPUs with every pair NVLink (best: b, weakest link PIX)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []*NodeState
			for _, s := range tc.nodes {
				nodes = append(nodes, nodeWith(s.name, s.topo(t), s.used...))
			}
			got, err := ChooseNode(nodes, tc.req, tc.pol)
			if tc.wantErr != "" {
				var ue *UnsatisfiableError
				if !errors.As(err, &ue) || ue.Node != "" || err.Error() != tc.wantErr {
					t.Fatalf("ChooseNode() error = %v, want UnsatisfiableError %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Node != tc.wantNode || !slices.Equal(got.GPUs, tc.wantGPUs) {
				t.Fatalf("ChooseNode() = %s %v, want %s %v", got.Node, got.GPUs, tc.wantNode, tc.wantGPUs)
			}
			// The set on the chosen node is what Allocate alone returns.
			idx := slices.IndexFunc(nodes, func(n *NodeState) bool { return n.Name == got.Node })
			alone, err := Allocate(nodes[idx], tc.req, tc.pol)
			if err != nil || !slices.Equal(alone.GPUs, got.GPUs) {
				t.Fatalf("Allocate on %s = %v, %v; ChooseNode chose %v", got.Node, alone.GPUs, err, got.GPUs)
			}
		})
	}
}

func TestChooseNodeShares(t *testing.T) {
	mk := func(name string, usage map[int]GPUUsage) *NodeState {
		n := nodeWith(name, pcie4(t))
		for p, u := range usage {
			n.Usage[p] = u
		}
		return n
	}
	for _, tc := range []struct {
		name     string
		nodes    []*NodeState
		req      Request
		pol      Policy
		wantNode string
		wantGPU  int
		wantErr  string
	}{
		{
			name: "binpack prefers a node with a shared GPU that fits",
			nodes: []*NodeState{
				mk("a", map[int]GPUUsage{0: {Exclusive: true}, 1: {Exclusive: true}}),
				mk("b", map[int]GPUUsage{3: shared(1, 4, 20)}),
			},
			req: share(4, 20), wantNode: "b", wantGPU: 3,
		},
		{
			name: "binpack opens a GPU on the busiest node when none is shared",
			nodes: []*NodeState{
				mk("a", nil),
				mk("b", map[int]GPUUsage{0: {Exclusive: true}, 1: {Exclusive: true}}),
			},
			req: share(4, 20), wantNode: "b", wantGPU: 2,
		},
		{
			name: "spread prefers the node with the most whole GPUs left",
			nodes: []*NodeState{
				mk("a", map[int]GPUUsage{3: shared(1, 4, 20)}),
				mk("b", nil),
			},
			req: share(4, 20), pol: Policy{Node: Spread, GPU: Spread}, wantNode: "b", wantGPU: 0,
		},
		{
			// On a the share does not fit the shared GPU and opens a whole
			// one; on b it fits, so b keeps more whole GPUs.
			name: "spread counts whole GPUs left after the share",
			nodes: []*NodeState{
				mk("a", map[int]GPUUsage{0: shared(1, 8, 50), 1: {Exclusive: true}}),
				mk("b", map[int]GPUUsage{2: shared(1, 2, 10), 3: {Exclusive: true}}),
			},
			req: share(12, 20), pol: Policy{Node: Spread, GPU: Binpack}, wantNode: "b", wantGPU: 2,
		},
		{
			name: "binpack prefers the fuller GPU when whole GPUs left are equal",
			nodes: []*NodeState{
				mk("a", map[int]GPUUsage{3: shared(1, 4, 20)}),
				mk("b", map[int]GPUUsage{3: shared(1, 8, 20)}),
			},
			req: share(4, 20), wantNode: "b", wantGPU: 3,
		},
		{
			name: "spread prefers the emptier GPU when whole GPUs left are equal",
			nodes: []*NodeState{
				mk("a", map[int]GPUUsage{3: shared(1, 4, 20)}),
				mk("b", map[int]GPUUsage{3: shared(1, 8, 20)}),
			},
			req: share(4, 20), pol: Policy{Node: Spread}, wantNode: "a", wantGPU: 3,
		},
		{
			name: "equal nodes go to the lowest name",
			nodes: []*NodeState{
				mk("z", map[int]GPUUsage{1: shared(1, 4, 20)}),
				mk("m", map[int]GPUUsage{1: shared(1, 4, 20)}),
			},
			req: share(4, 20), wantNode: "m", wantGPU: 1,
		},
		{
			name: "no node fits",
			nodes: []*NodeState{
				mk("a", map[int]GPUUsage{0: shared(1, 15, 50), 1: {Exclusive: true}, 2: {Exclusive: true}, 3: {Exclusive: true}}),
			},
			req: share(2, 20), wantErr: "no node has a GPU that fits a share of 2Gi memory and 20% cores (1 nodes checked)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ChooseNode(tc.nodes, tc.req, tc.pol)
			if tc.wantErr != "" {
				var ue *UnsatisfiableError
				if !errors.As(err, &ue) || err.Error() != tc.wantErr {
					t.Fatalf("ChooseNode() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Node != tc.wantNode || !slices.Equal(got.GPUs, []int{tc.wantGPU}) {
				t.Fatalf("ChooseNode() = %s %v, want %s [%d]", got.Node, got.GPUs, tc.wantNode, tc.wantGPU)
			}
		})
	}
}

func TestChooseNodeNoNodes(t *testing.T) {
	_, err := ChooseNode(nil, Request{GPUs: 1}, Policy{})
	var ue *UnsatisfiableError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no nodes") {
		t.Fatalf("ChooseNode(nil) error = %v", err)
	}
}
