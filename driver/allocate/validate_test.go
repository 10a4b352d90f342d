package allocate

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func TestInvalidInput(t *testing.T) {
	topo := pcie4(t)
	ok := func() *NodeState { return nodeWith("node-a", topo) }
	withUsage := func(p int, u GPUUsage) *NodeState {
		n := ok()
		n.Usage[p] = u
		return n
	}
	for _, tc := range []struct {
		name    string
		node    *NodeState
		req     Request
		pol     Policy
		wantErr string
	}{
		{name: "zero GPUs", node: ok(), req: Request{}, wantErr: "request: gpus must be >= 1, got 0"},
		{name: "negative GPUs", node: ok(), req: Request{GPUs: -2}, wantErr: "request: gpus must be >= 1, got -2"},
		{name: "too many GPUs", node: ok(), req: Request{GPUs: 65}, wantErr: "request: gpus must be <= 64, got 65"},
		{name: "gpus and share", node: ok(), req: Request{GPUs: 1, Share: &ShareRequest{MemoryBytes: 1, Cores: 1}},
			wantErr: "request: gpus and share are mutually exclusive, got gpus=1 and a share"},
		{name: "share cores too high", node: ok(), req: share(1, 130), wantErr: "request: share.cores must be 1..100, got 130"},
		{name: "share cores zero", node: ok(), req: share(1, 0), wantErr: "request: share.cores must be 1..100, got 0"},
		{name: "share memory zero", node: ok(), req: share(0, 10), wantErr: "request: share.memoryBytes must be >= 1, got 0"},
		{name: "share with required link", node: ok(),
			req:     Request{Share: &ShareRequest{MemoryBytes: 1, Cores: 1}, RequiredLink: topology.LinkNVLink},
			wantErr: "request: requiredLink applies to whole GPUs only, got NV1 with a share"},
		{name: "required link out of range", node: ok(), req: Request{GPUs: 2, RequiredLink: 200},
			wantErr: "request: requiredLink must be a link class up to NV18, got 200"},
		{name: "eligible length", node: ok(), req: Request{GPUs: 1, Eligible: []bool{true}},
			wantErr: "request: eligible has 1 entries, node node-a has 4 GPUs"},
		{name: "eligible and eligible by node", node: ok(), req: Request{GPUs: 1, Eligible: []bool{true, true, true, true}, EligibleByNode: map[string][]bool{}},
			wantErr: "request: eligible and eligibleByNode are mutually exclusive, got both"},
		{name: "eligible by node length", node: ok(), req: Request{GPUs: 1, EligibleByNode: map[string][]bool{"node-a": {true}}},
			wantErr: `request: eligibleByNode["node-a"] has 1 entries, the node has 4 GPUs`},
		{name: "node strategy", node: ok(), req: Request{GPUs: 1}, pol: Policy{Node: "first-fit"},
			wantErr: `policy.node: unknown strategy "first-fit" (want binpack or spread)`},
		{name: "gpu strategy", node: ok(), req: Request{GPUs: 1}, pol: Policy{GPU: "Binpack"},
			wantErr: `policy.gpu: unknown strategy "Binpack" (want binpack or spread)`},
		{name: "nil node", node: nil, req: Request{GPUs: 1}, wantErr: "node: nil"},
		{name: "nil topology", node: &NodeState{Name: "node-a"}, req: Request{GPUs: 1}, wantErr: "node node-a: topology is nil"},
		{name: "usage length", node: &NodeState{Name: "node-a", Topology: topo, Usage: make([]GPUUsage, 3)}, req: Request{GPUs: 1},
			wantErr: "node node-a: usage has 3 entries for 4 GPUs"},
		{name: "negative max shares", node: &NodeState{Name: "node-a", Topology: topo, MaxSharesPerGPU: -1}, req: Request{GPUs: 1},
			wantErr: "node node-a: maxSharesPerGPU must be >= 0, got -1"},
		{name: "exclusive with shares", node: withUsage(2, GPUUsage{Exclusive: true, Shares: 1, MemoryBytes: 5, Cores: 5}), req: Request{GPUs: 1},
			wantErr: "node node-a: usage[2]: exclusive GPU also holds 1 shares (5 bytes, 5 cores)"},
		{name: "negative shares", node: withUsage(1, GPUUsage{Shares: -1}), req: Request{GPUs: 1},
			wantErr: "node node-a: usage[1]: shares must be >= 0, got -1"},
		{name: "negative memory", node: withUsage(1, GPUUsage{Shares: 1, MemoryBytes: -1}), req: Request{GPUs: 1},
			wantErr: "node node-a: usage[1]: memoryBytes must be >= 0, got -1"},
		{name: "cores over 100", node: withUsage(1, GPUUsage{Shares: 1, Cores: 101}), req: Request{GPUs: 1},
			wantErr: "node node-a: usage[1]: cores must be 0..100, got 101"},
		{name: "consumption without shares", node: withUsage(3, GPUUsage{MemoryBytes: 7}), req: Request{GPUs: 1},
			wantErr: "node node-a: usage[3]: no shares but 7 bytes and 0 cores consumed"},
		{name: "memory over the largest over-commit", node: withUsage(0, GPUUsage{Shares: 1, MemoryBytes: 65 * gib}), req: Request{GPUs: 1},
			wantErr: "node node-a: usage[0]: memoryBytes 69793218560 exceeds 400% of the GPU's 17179869184"},
		{name: "over-commit out of range", node: &NodeState{Name: "node-a", Topology: topo, MemoryOvercommitPercent: 50}, req: Request{GPUs: 1},
			wantErr: "node node-a: memoryOvercommitPercent must be 0 or 100..400, got 50"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Allocate(tc.node, tc.req, tc.pol)
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("Allocate() error = %v, want %q", err, tc.wantErr)
			}
			var ue *UnsatisfiableError
			if errors.As(err, &ue) {
				t.Fatalf("invalid input reported as unsatisfiable: %v", err)
			}
			if tc.node != nil {
				_, err = ChooseNode([]*NodeState{tc.node}, tc.req, tc.pol)
				if err == nil || !strings.HasSuffix(err.Error(), tc.wantErr) {
					t.Fatalf("ChooseNode() error = %v, want it to end in %q", err, tc.wantErr)
				}
			}
		})
	}
}
