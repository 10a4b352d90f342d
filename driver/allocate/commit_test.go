package allocate

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func TestCommitRelease(t *testing.T) {
	whole2 := Request{GPUs: 2}
	sh := share(4, 30)
	for _, tc := range []struct {
		name    string
		setup   func(n *NodeState)
		release bool
		req     Request
		res     Result
		wantErr string
		want    []GPUUsage // usage after a successful call
	}{
		{name: "commit whole", req: whole2, res: Result{Node: "node-a", GPUs: []int{0, 1}},
			want: []GPUUsage{{Exclusive: true}, {Exclusive: true}, {}, {}}},
		{name: "commit whole onto an exclusive GPU", setup: func(n *NodeState) { n.Usage[1].Exclusive = true },
			req: whole2, res: Result{Node: "node-a", GPUs: []int{0, 1}},
			wantErr: "commit: GPU at position 1 is not free (exclusive=true, shares=0)"},
		{name: "commit whole onto a shared GPU", setup: func(n *NodeState) { n.Usage[0] = shared(1, 1, 1) },
			req: whole2, res: Result{Node: "node-a", GPUs: []int{0, 1}},
			wantErr: "commit: GPU at position 0 is not free (exclusive=false, shares=1)"},
		{name: "commit share", setup: func(n *NodeState) { n.Usage[2] = shared(1, 2, 10) },
			req: sh, res: Result{Node: "node-a", GPUs: []int{2}},
			want: []GPUUsage{{}, {}, shared(2, 6, 40), {}}},
		{name: "commit share onto an exclusive GPU", setup: func(n *NodeState) { n.Usage[2].Exclusive = true },
			req: sh, res: Result{Node: "node-a", GPUs: []int{2}},
			wantErr: "commit: share on GPU at position 2: given out whole"},
		{name: "commit share that does not fit", setup: func(n *NodeState) { n.Usage[2] = shared(1, 2, 80) },
			req: sh, res: Result{Node: "node-a", GPUs: []int{2}},
			wantErr: "commit: share on GPU at position 2: short of cores"},
		{name: "wrong node", req: whole2, res: Result{Node: "node-b", GPUs: []int{0, 1}},
			wantErr: `commit: result.node is "node-b", this node is "node-a"`},
		{name: "wrong count", req: whole2, res: Result{Node: "node-a", GPUs: []int{0}},
			wantErr: "commit: result.gpus has 1 positions, the request needs 2"},
		{name: "unsorted", req: whole2, res: Result{Node: "node-a", GPUs: []int{1, 0}},
			wantErr: "commit: result.gpus must be ascending without duplicates, got [1 0]"},
		{name: "duplicate", req: whole2, res: Result{Node: "node-a", GPUs: []int{1, 1}},
			wantErr: "commit: result.gpus must be ascending without duplicates, got [1 1]"},
		{name: "out of range", req: whole2, res: Result{Node: "node-a", GPUs: []int{3, 4}},
			wantErr: "commit: result.gpus: position 4 out of range 0..3"},
		{name: "not eligible", req: Request{GPUs: 2, Eligible: []bool{true, false, true, true}}, res: Result{Node: "node-a", GPUs: []int{0, 1}},
			wantErr: "commit: result.gpus: position 1 is not eligible for the request"},
		{name: "not eligible by node", req: Request{GPUs: 2, EligibleByNode: map[string][]bool{"node-a": {true, true, false, true}}},
			res:     Result{Node: "node-a", GPUs: []int{1, 2}},
			wantErr: "commit: result.gpus: position 2 is not eligible for the request"},
		{name: "required link not met", req: Request{GPUs: 2, RequiredLink: topology.LinkPIX}, res: Result{Node: "node-a", GPUs: []int{1, 2}},
			wantErr: "commit: result.gpus [1 2]: weakest link SYS is below the required PIX"},
		{name: "invalid request", req: Request{}, res: Result{Node: "node-a"},
			wantErr: "commit: request: gpus must be >= 1, got 0"},
		{name: "release whole", release: true, setup: func(n *NodeState) { n.Usage[0].Exclusive, n.Usage[3].Exclusive = true, true },
			req: whole2, res: Result{Node: "node-a", GPUs: []int{0, 3}}, want: make([]GPUUsage, 4)},
		{name: "release whole not held", release: true, setup: func(n *NodeState) { n.Usage[0].Exclusive = true },
			req: whole2, res: Result{Node: "node-a", GPUs: []int{0, 3}},
			wantErr: "release: GPU at position 3 is not given out whole"},
		{name: "release share", release: true, setup: func(n *NodeState) { n.Usage[1] = shared(2, 6, 40) },
			req: sh, res: Result{Node: "node-a", GPUs: []int{1}}, want: []GPUUsage{{}, shared(1, 2, 10), {}, {}}},
		{name: "release last share", release: true, setup: func(n *NodeState) { n.Usage[1] = shared(1, 4, 30) },
			req: sh, res: Result{Node: "node-a", GPUs: []int{1}}, want: make([]GPUUsage, 4)},
		{name: "release share larger than held", release: true, setup: func(n *NodeState) { n.Usage[1] = shared(1, 2, 30) },
			req: sh, res: Result{Node: "node-a", GPUs: []int{1}},
			wantErr: "release: GPU at position 1 holds 1 shares (2147483648 bytes, 30 cores), less than the share released"},
		{name: "release last share that does not match", release: true, setup: func(n *NodeState) { n.Usage[1] = shared(1, 8, 30) },
			req: sh, res: Result{Node: "node-a", GPUs: []int{1}},
			wantErr: "release: GPU at position 1: last share holds 8589934592 bytes and 30 cores, released 4294967296 bytes and 30 cores"},
		{name: "release share not held", release: true,
			req: sh, res: Result{Node: "node-a", GPUs: []int{1}},
			wantErr: "release: GPU at position 1 holds 0 shares (0 bytes, 0 cores), less than the share released"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := nodeWith("node-a", pcie4(t))
			if tc.setup != nil {
				tc.setup(node)
			}
			before := slices.Clone(node.Usage)
			var err error
			if tc.release {
				err = node.Release(tc.req, tc.res)
			} else {
				err = node.Commit(tc.req, tc.res)
			}
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				if !slices.Equal(node.Usage, before) {
					t.Fatalf("failed call changed usage from %v to %v", before, node.Usage)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(node.Usage, tc.want) {
				t.Fatalf("usage = %v, want %v", node.Usage, tc.want)
			}
		})
	}
}

func TestCommitOnNodeWithoutUsage(t *testing.T) {
	node := &NodeState{Name: "node-a", Topology: pcie4(t)}
	req := Request{GPUs: 2}
	res, err := Allocate(node, req, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Commit(req, res); err != nil {
		t.Fatal(err)
	}
	if len(node.Usage) != 4 || !node.Usage[res.GPUs[0]].Exclusive || !node.Usage[res.GPUs[1]].Exclusive {
		t.Fatalf("usage after commit of %v = %v", res.GPUs, node.Usage)
	}
	empty := &NodeState{Name: "node-a", Topology: pcie4(t)}
	if err := empty.Release(req, res); err == nil || !strings.Contains(err.Error(), "not given out whole") {
		t.Fatalf("Release on a node without usage: error = %v", err)
	}
}
