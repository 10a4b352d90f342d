package allocate

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

type wholeCase struct {
	name     string
	used     []int
	req      Request
	want     []int   // exact set, when the objective pins one
	wantAny  [][]int // acceptable sets, when only the class matters
	wantWeak topology.Link
	wantAgg  int
	wantErr  string // substring of an UnsatisfiableError
}

func runWhole(t *testing.T, topo *topology.Topology, cases []wholeCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := nodeWith("node-a", topo, tc.used...)
			got, err := Allocate(node, tc.req, Policy{})
			if tc.wantErr != "" {
				var ue *UnsatisfiableError
				if !errors.As(err, &ue) {
					t.Fatalf("Allocate() error = %v, want UnsatisfiableError", err)
				}
				if !strings.Contains(ue.Error(), tc.wantErr) || ue.Node != "node-a" {
					t.Fatalf("Allocate() error = %q on %q, want %q on node-a", ue.Error(), ue.Node, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate() error = %v", err)
			}
			if got.Node != "node-a" {
				t.Errorf("Node = %q, want node-a", got.Node)
			}
			if tc.want != nil && !slices.Equal(got.GPUs, tc.want) {
				t.Errorf("GPUs = %v, want %v", got.GPUs, tc.want)
			}
			if tc.wantAny != nil && !slices.ContainsFunc(tc.wantAny, func(w []int) bool { return slices.Equal(w, got.GPUs) }) {
				t.Errorf("GPUs = %v, want one of %v", got.GPUs, tc.wantAny)
			}
			if got.WeakestLink != tc.wantWeak {
				t.Errorf("WeakestLink = %s, want %s", got.WeakestLink, tc.wantWeak)
			}
			if tc.wantAgg != 0 && got.AggregateLink != tc.wantAgg {
				t.Errorf("AggregateLink = %d, want %d", got.AggregateLink, tc.wantAgg)
			}
		})
	}
}

var (
	nv1, nv2, nv4 = topology.NVLink(1), topology.NVLink(2), topology.NVLink(4)
	nv6, nv12     = topology.NVLink(6), topology.NVLink(12)
)

func TestAllocateV100HybridCubeMesh(t *testing.T) {
	runWhole(t, v100(t), []wholeCase{
		{
			// Every NV2 pair ties on link quality; the ones inside a quad
			// leave the other quad whole, and {0,3} is the lowest of those.
			name: "2 GPUs take an NV2 pair inside a quad", req: Request{GPUs: 2},
			want: []int{0, 3}, wantWeak: nv2,
		},
		{
			name: "4 GPUs take an all-NVLink quad", req: Request{GPUs: 4},
			want: []int{0, 1, 2, 3}, wantWeak: nv1, wantAgg: 3*int(nv1) + 3*int(nv2),
		},
		{
			name: "4 GPUs with NVLink required after a GPU of the first quad is taken", used: []int{1},
			req:  Request{GPUs: 4, RequiredLink: topology.LinkNVLink},
			want: []int{4, 5, 6, 7}, wantWeak: nv1,
		},
		{
			name: "4 GPUs with NVLink required when both quads are broken", used: []int{0, 4},
			req:     Request{GPUs: 4, RequiredLink: topology.LinkNVLink},
			wantErr: "no 4 free GPUs with every pair NVLink on node-a (best free set of 4: weakest link SYS)",
		},
		{
			// GPU0 has the fewest fast links left to free GPUs, but taking
			// it would break {0,1,2,3}, the last all-NVLink quad.
			name: "1 GPU keeps the last intact NVLink quad", used: []int{6}, req: Request{GPUs: 1},
			want: []int{5},
		},
		{
			name: "8 GPUs take the node", req: Request{GPUs: 8},
			want: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantWeak: topology.LinkSYS,
		},
		{
			name: "3 GPUs take the best triangle", req: Request{GPUs: 3},
			wantAny:  [][]int{{0, 2, 3}, {1, 2, 3}, {0, 1, 3}, {0, 1, 2}, {4, 5, 6}, {4, 5, 7}, {4, 6, 7}, {5, 6, 7}},
			wantWeak: nv1, wantAgg: int(nv1) + 2*int(nv2),
		},
		{
			name: "2 GPUs with NV2 required beyond what is left", used: []int{0, 1, 2, 4, 5, 7},
			req:     Request{GPUs: 2, RequiredLink: nv2},
			wantErr: "no 2 free GPUs with every pair NV2 or better on node-a (best free set of 2: weakest link SYS)",
		},
		{
			name: "too few free GPUs", used: []int{0, 1, 2, 3, 4},
			req: Request{GPUs: 4}, wantErr: "only 3 of 8 GPUs free on node-a, need 4",
		},
		{
			name: "eligible restricts the choice", req: Request{GPUs: 2, Eligible: []bool{false, false, false, false, true, false, true, true}},
			want: []int{4, 7}, wantWeak: nv2,
		},
		{
			name: "eligibility by node name", req: Request{GPUs: 2, EligibleByNode: map[string][]bool{
				"node-a": {false, true, false, false, false, false, false, true},
				"node-b": {true, true, true, true, true, true, true, true},
			}},
			want: []int{1, 7}, wantWeak: nv2,
		},
		{
			name: "node missing from eligibility by node", req: Request{GPUs: 1, EligibleByNode: map[string][]bool{"node-b": nil}},
			wantErr: "only 0 eligible free GPUs on node-a (8 of 8 free), need 1",
		},
		{
			name: "too few eligible GPUs", used: []int{4},
			req:     Request{GPUs: 2, Eligible: []bool{false, false, false, false, true, false, true, false}},
			wantErr: "only 1 eligible free GPUs on node-a (7 of 8 free), need 2",
		},
	})
}

func TestAllocateP40(t *testing.T) {
	runWhole(t, p40(t), []wholeCase{
		{
			// A pair from the triple keeps the PIX quad intact.
			name: "2 GPUs take a PIX pair", req: Request{GPUs: 2},
			want: []int{0, 1}, wantWeak: topology.LinkPIX,
		},
		{
			name: "3 GPUs take the PIX triple", req: Request{GPUs: 3},
			want: []int{0, 1, 2}, wantWeak: topology.LinkPIX,
		},
		{
			name: "4 GPUs take the PIX quad", req: Request{GPUs: 4},
			want: []int{3, 4, 5, 6}, wantWeak: topology.LinkPIX,
		},
		{
			name: "1 GPU on an idle node keeps the quad", req: Request{GPUs: 1},
			want: []int{0}, wantWeak: topology.LinkNone,
		},
		{
			// GPU1 and GPU2 only form a pair now; taking one of them leaves
			// the PIX quad and its triples for later jobs.
			name: "1 GPU takes the leftover of the broken triple", used: []int{0}, req: Request{GPUs: 1},
			want: []int{1},
		},
		{
			// Two PIX triples; a GPU from the one already broken down to
			// a pair keeps the other triple.
			name: "1 GPU does not break the remaining triple", used: []int{0, 3}, req: Request{GPUs: 1},
			want: []int{1},
		},
		{
			name: "3 GPUs with PIX required across switches fails", used: []int{0, 3, 4},
			req:     Request{GPUs: 3, RequiredLink: topology.LinkPIX},
			wantErr: "no 3 free GPUs with every pair PIX or better on node-a (best free set of 3: weakest link PHB)",
		},
	})
}

func TestAllocateNVBridge(t *testing.T) {
	runWhole(t, nvbridge(t), []wholeCase{
		{
			name: "1 GPU takes the other half of a broken pair", used: []int{4}, req: Request{GPUs: 1},
			want: []int{5},
		},
		{
			// 3 and 6 are both halves of broken pairs; 6 has only NODE
			// links to free GPUs, 3 has PXB ones to the intact pair 0-1.
			name: "1 GPU takes the half of a broken pair that costs least", used: []int{2, 7}, req: Request{GPUs: 1},
			want: []int{6},
		},
		{
			// {2,3} keeps the NODE quad 4-7 for a 4-GPU job, {4,5} the
			// PXB triple 1-3 for a 3-GPU job: equal under the default mix.
			name: "2 GPUs take an intact bridge pair", used: []int{0}, req: Request{GPUs: 2},
			wantAny: [][]int{{2, 3}, {4, 5}}, wantWeak: nv4,
		},
		{
			// With 0 and 6 taken, {2,3} and {4,5} remain as bridge pairs;
			// taking {4,5} leaves {1,2,3} and their PXB links for a
			// later quad.
			name: "2 GPUs never take a broken pair", used: []int{0, 6}, req: Request{GPUs: 2},
			want: []int{4, 5}, wantWeak: nv4,
		},
		{
			// Two whole bridge pairs behind one PCIe switch tree (PXB)
			// beat two joined through the host (NODE).
			name: "4 GPUs take two bridge pairs on one switch", req: Request{GPUs: 4},
			want: []int{0, 1, 2, 3}, wantWeak: topology.LinkPXB,
		},
	})
}

func TestAllocateUniformAndLarge(t *testing.T) {
	t.Run("dgx-a100", func(t *testing.T) {
		runWhole(t, dgxA100(t), []wholeCase{
			{name: "4 of 8", req: Request{GPUs: 4}, want: []int{0, 1, 2, 3}, wantWeak: nv12},
			{name: "3 with some used", used: []int{1, 6}, req: Request{GPUs: 3}, want: []int{0, 2, 3}, wantWeak: nv12},
		})
	})
	t.Run("dgx2-16", func(t *testing.T) {
		runWhole(t, dgx2(t), []wholeCase{
			{name: "8 of 16", req: Request{GPUs: 8}, want: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantWeak: nv6},
			{name: "16 of 16", req: Request{GPUs: 16}, want: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, wantWeak: nv6},
		})
	})
	t.Run("pcie-16", func(t *testing.T) {
		runWhole(t, pcie16(t), []wholeCase{
			{name: "4 take a switch", req: Request{GPUs: 4}, want: []int{0, 1, 2, 3}, wantWeak: topology.LinkPIX},
			{name: "8 take a NUMA node", req: Request{GPUs: 8}, want: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantWeak: topology.LinkNODE},
			{
				// Switch 0 is already broken; taking from it keeps three
				// intact switches for quads.
				name: "1 prefers a switch that is already partly used", used: []int{9},
				req: Request{GPUs: 1}, want: []int{8},
			},
			{
				name: "2 avoid intact switches", used: []int{5},
				req: Request{GPUs: 2}, want: []int{4, 6}, wantWeak: topology.LinkPIX,
			},
		})
	})
	t.Run("synthetic-32", func(t *testing.T) {
		runWhole(t, synthetic32(t), []wholeCase{
			{name: "8 take a mesh", req: Request{GPUs: 8}, want: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantWeak: topology.LinkPXB},
			{name: "8 avoid a broken mesh", used: []int{3}, req: Request{GPUs: 8}, want: []int{8, 9, 10, 11, 12, 13, 14, 15}, wantWeak: topology.LinkPXB},
			{name: "4 take an NVLink quad of a mesh", used: []int{0}, req: Request{GPUs: 4}, want: []int{4, 5, 6, 7}, wantWeak: nv1},
			{name: "16 take two islands of one NUMA node", used: []int{0}, req: Request{GPUs: 16}, want: seq(16, 32), wantWeak: topology.LinkNODE},
			{
				name: "NVLink required beyond any island", req: Request{GPUs: 9, RequiredLink: topology.LinkNVLink},
				wantErr: "no 9 free GPUs with every pair NVLink on node-a (best free set of 9: weakest link NODE)",
			},
			{
				// 20 GPUs free, so the search goes by components: GPU7 and
				// GPU15 have no NV2 partner left; 7 is lower.
				name: "1 GPU with more than 16 free takes from a broken mesh", used: []int{0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12},
				req: Request{GPUs: 1}, want: []int{7},
			},
			{
				name: "1 GPU meets any required link", used: []int{0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12},
				req: Request{GPUs: 1, RequiredLink: topology.NVLink(18)}, want: []int{7},
			},
		})
	})
}

func TestAllocateBeyondExactSearch(t *testing.T) {
	nv18 := topology.NVLink(18)
	runWhole(t, nvlinkTiered(t), []wholeCase{
		{name: "4 take an NV18 quad", req: Request{GPUs: 4}, want: []int{0, 1, 2, 3}, wantWeak: nv18},
		{name: "4 avoid broken quads", used: []int{1, 6}, req: Request{GPUs: 4}, want: []int{8, 9, 10, 11}, wantWeak: nv18},
		{
			// One NV12 component of 32: the beam search decides.
			name: "8 take two whole quads", used: []int{1, 6},
			req: Request{GPUs: 8}, want: []int{8, 9, 10, 11, 12, 13, 14, 15}, wantWeak: nv12,
			wantAgg: 12*int(nv18) + 16*int(nv12),
		},
		{
			name: "3 take the rest of a broken quad", used: []int{1, 6},
			req: Request{GPUs: 3}, want: []int{0, 2, 3}, wantWeak: nv18,
		},
		{
			name: "NV18 required beyond a quad", req: Request{GPUs: 5, RequiredLink: nv18},
			wantErr: "no 5 free GPUs with every pair NV18 or better on node-a (best free set of 5: weakest link NV12)",
		},
	})
}

func seq(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func TestUnnamedNodeInMessages(t *testing.T) {
	node := nodeWith("", pcie4(t), 0, 1)
	_, err := Allocate(node, Request{GPUs: 3}, Policy{})
	if err == nil || err.Error() != `only 2 of 4 GPUs free on "", need 3` {
		t.Fatalf("Allocate on an unnamed node: error = %v", err)
	}
}
