package allocate

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func share(memGiB, cores int64) Request {
	return Request{Share: &ShareRequest{MemoryBytes: memGiB * gib, Cores: cores}}
}

// onlyFirst makes only the first of 8 GPUs eligible for r.
func onlyFirst(r Request) Request {
	r.Eligible = make([]bool, 8)
	r.Eligible[0] = true
	return r
}

func shared(shares int, memGiB, cores int64) GPUUsage {
	return GPUUsage{Shares: shares, MemoryBytes: memGiB * gib, Cores: cores}
}

func TestAllocateShare(t *testing.T) {
	excl := GPUUsage{Exclusive: true}
	for _, tc := range []struct {
		name      string
		topo      func(testing.TB) *topology.Topology
		usage     map[int]GPUUsage
		maxShares int
		// overcommit is NodeState.MemoryOvercommitPercent.
		overcommit int
		req        Request
		gpu        Strategy
		want       int
		wantErr    string
	}{
		{
			name: "binpack takes the fullest GPU that fits", topo: v100,
			usage: map[int]GPUUsage{2: shared(1, 4, 20), 5: shared(2, 10, 50)},
			req:   share(4, 20), want: 5,
		},
		{
			name: "binpack skips a GPU short of memory", topo: v100,
			usage: map[int]GPUUsage{2: shared(1, 4, 20), 5: shared(2, 10, 50)},
			req:   share(8, 20), want: 2,
		},
		{
			name: "binpack skips a GPU short of cores", topo: v100,
			usage: map[int]GPUUsage{2: shared(1, 4, 20), 5: shared(2, 10, 50)},
			req:   share(1, 60), want: 2,
		},
		{
			name: "binpack skips a GPU at the share limit", topo: v100, maxShares: 2,
			usage: map[int]GPUUsage{2: shared(1, 4, 20), 5: shared(2, 10, 50)},
			req:   share(1, 10), want: 2,
		},
		{
			name: "binpack ties on load go to the least memory left", topo: v100,
			usage: map[int]GPUUsage{1: shared(1, 2, 50), 6: shared(1, 8, 50)},
			req:   share(1, 10), want: 6,
		},
		{
			// No shared GPU fits, so a fresh one opens: the same GPU a
			// one-GPU whole request would take. Of the halves left by
			// broken bridge pairs, GPU5 has only NODE links to free GPUs,
			// GPU3 PXB ones.
			name: "binpack opens the fresh GPU a whole request would take", topo: nvbridge,
			usage: map[int]GPUUsage{4: excl, 2: shared(1, 46, 10)},
			req:   share(4, 10), want: 5,
		},
		{
			name: "spread takes a fresh GPU over a loaded one", topo: v100,
			usage: map[int]GPUUsage{0: shared(1, 4, 20), 1: excl, 2: excl, 3: excl, 4: excl, 5: excl, 6: excl},
			req:   share(1, 10), gpu: Spread, want: 7,
		},
		{
			name: "spread takes the least loaded shared GPU", topo: pcie4,
			usage: map[int]GPUUsage{0: shared(1, 8, 20), 1: shared(1, 2, 30), 2: shared(1, 4, 10), 3: shared(1, 12, 10)},
			req:   share(1, 10), gpu: Spread, want: 2,
		},
		{
			name: "shares never land on an exclusive GPU", topo: pcie4,
			usage: map[int]GPUUsage{0: excl, 1: excl, 2: shared(1, 15, 90), 3: excl},
			req:   share(1, 10), want: 2,
		},
		{
			name: "every GPU exclusive", topo: pcie4,
			usage: map[int]GPUUsage{0: excl, 1: excl, 2: excl, 3: excl},
			req:   share(1, 10), wantErr: "no GPU on node-a fits a share of 1Gi memory and 10% cores (4 GPUs: 4 given out whole)",
		},
		{
			name: "share larger than any GPU", topo: v100,
			req: share(17, 10), wantErr: "(8 GPUs: 8 short of memory)",
		},
		{
			name: "mixed misfits are counted", topo: pcie4, maxShares: 1,
			usage:   map[int]GPUUsage{0: excl, 1: shared(1, 1, 10), 2: shared(1, 1, 95)},
			req:     Request{Share: &ShareRequest{MemoryBytes: 1536 << 20, Cores: 10}, Eligible: []bool{true, true, true, false}},
			wantErr: "fits a share of 1.5Gi memory and 10% cores (4 GPUs: 1 not eligible, 1 given out whole, 2 at the share limit)",
		},
		{
			name: "without over-commit shares stay within the GPU's memory", topo: v100,
			usage: map[int]GPUUsage{0: shared(1, 12, 10)},
			req:   onlyFirst(share(8, 10)), wantErr: "(8 GPUs: 7 not eligible, 1 short of memory)",
		},
		{
			name: "memory over-commit 150% lets shares add up past the GPU's memory", topo: v100, overcommit: 150,
			usage: map[int]GPUUsage{0: shared(1, 12, 10)},
			req:   onlyFirst(share(8, 10)), want: 0,
		},
		{
			name: "memory over-commit stops at its percentage", topo: v100, overcommit: 150,
			usage: map[int]GPUUsage{0: shared(2, 20, 10)},
			req:   onlyFirst(share(5, 10)), wantErr: "(8 GPUs: 7 not eligible, 1 short of memory)",
		},
		{
			name: "memory over-commit never over-commits cores", topo: v100, overcommit: 400,
			usage: map[int]GPUUsage{0: shared(1, 1, 95)},
			req:   onlyFirst(share(1, 10)), wantErr: "(8 GPUs: 7 not eligible, 1 short of cores)",
		},
		{
			name: "unknown memory size", topo: func(tb testing.TB) *topology.Topology { return matrix(tb, 0, "X PIX", "PIX X") },
			req: share(1, 10), wantErr: "(2 GPUs: 2 memory size unknown)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := nodeWith("node-a", tc.topo(t))
			node.MaxSharesPerGPU = tc.maxShares
			node.MemoryOvercommitPercent = tc.overcommit
			for p, u := range tc.usage {
				node.Usage[p] = u
			}
			got, err := Allocate(node, tc.req, Policy{GPU: tc.gpu})
			if tc.wantErr != "" {
				var ue *UnsatisfiableError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Allocate() error = %v, want UnsatisfiableError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate() error = %v", err)
			}
			if len(got.GPUs) != 1 || got.GPUs[0] != tc.want || got.WeakestLink != topology.LinkNone {
				t.Fatalf("Allocate() = %+v, want GPU %d", got, tc.want)
			}
			if err := node.Commit(tc.req, got); err != nil {
				t.Fatalf("Commit() error = %v", err)
			}
		})
	}
}

func TestWholeAndSharesExcludeEachOther(t *testing.T) {
	node := nodeWith("node-a", pcie4(t))
	node.Usage[1] = shared(1, 1, 10)
	if _, err := Allocate(node, Request{GPUs: 4}, Policy{}); err == nil || !strings.Contains(err.Error(), "only 3 of 4 GPUs free") {
		t.Fatalf("4 whole GPUs with one shared: error = %v, want only 3 free", err)
	}
	got, err := Allocate(node, Request{GPUs: 1}, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	// GPU0's PIX partner is shared, so GPU0 is the one that breaks nothing.
	if got.GPUs[0] != 0 {
		t.Fatalf("1 whole GPU next to a shared one = %v, want [0]", got.GPUs)
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{512, "512B"},
		{1536, "1.5Ki"},
		{4 * gib, "4Gi"},
		{3*gib + 1, "3.0Gi"},
		{1 << 40, "1Ti"},
	} {
		if got := formatBytes(tc.in); got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Shares of different sharing groups never meet on a GPU: a grouped share
// goes to a GPU of its own group or a fresh one, an ungrouped share never
// joins a grouped GPU, a GPU of mixed groups takes nothing, and the group
// follows Commit and Release.
func TestShareGroups(t *testing.T) {
	grouped := func(u GPUUsage, g string) GPUUsage { u.Group = g; return u }
	in := func(r Request, g string) Request {
		s := *r.Share
		s.Group = g
		r.Share = &s
		return r
	}
	for _, tc := range []struct {
		name    string
		usage   map[int]GPUUsage
		req     Request
		want    int // -1: a fresh GPU, whichever
		wantErr string
	}{
		{
			name:  "a grouped share packs onto its group's GPU",
			usage: map[int]GPUUsage{2: shared(1, 4, 20), 5: grouped(shared(2, 10, 50), "mps:a")},
			req:   in(share(4, 20), "mps:a"), want: 5,
		},
		{
			name:  "a grouped share skips another group's GPU and ungrouped shares for a fresh GPU",
			usage: map[int]GPUUsage{2: shared(1, 4, 20), 5: grouped(shared(2, 10, 50), "mps:a")},
			req:   in(share(4, 20), "mps:b"), want: -1,
		},
		{
			name:  "an ungrouped share skips a grouped GPU",
			usage: map[int]GPUUsage{5: grouped(shared(2, 10, 50), "mps:a")},
			req:   share(4, 20), want: -1,
		},
		{
			name: "no GPU fits when every GPU holds another group's shares",
			usage: map[int]GPUUsage{0: shared(1, 1, 10), 1: shared(1, 1, 10), 2: shared(1, 1, 10), 3: shared(1, 1, 10),
				4: grouped(shared(1, 1, 10), "mps:a"), 5: grouped(shared(1, 1, 10), "mps:a"), 6: grouped(shared(1, 1, 10), MixedShareGroups), 7: shared(1, 1, 10)},
			req: in(share(1, 10), "mps:b"), wantErr: "8 holding shares of another sharing group",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := nodeWith("node-a", v100(t))
			for p, u := range tc.usage {
				node.Usage[p] = u
			}
			got, err := Allocate(node, tc.req, Policy{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate() error = %v", err)
			}
			p := got.GPUs[0]
			if tc.want >= 0 && p != tc.want || tc.want < 0 && node.Usage[p].Shares != 0 {
				t.Fatalf("Allocate() = GPU %d (usage %+v), want %d (-1: a fresh GPU)", p, node.Usage[p], tc.want)
			}
			before := node.Usage[p]
			if err := node.Commit(tc.req, got); err != nil {
				t.Fatal(err)
			}
			if g := node.Usage[p].Group; g != tc.req.Share.Group {
				t.Errorf("group after Commit = %q, want %q", g, tc.req.Share.Group)
			}
			if err := node.Release(tc.req, got); err != nil {
				t.Fatal(err)
			}
			if node.Usage[p] != before {
				t.Errorf("usage after Release = %+v, want %+v", node.Usage[p], before)
			}
		})
	}
	if err := (GPUUsage{Group: "mps:a"}).validate(); err == nil || !strings.Contains(err.Error(), `no shares but sharing group "mps:a"`) {
		t.Errorf("validate of a group without shares: %v", err)
	}
}
