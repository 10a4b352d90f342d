package topology

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

func mustParseFile(t testing.TB, name string) *Topology {
	t.Helper()
	topo, err := ParseFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("ParseFile(%s): %v", name, err)
	}
	return topo
}

func TestGroupSizes(t *testing.T) {
	tests := []struct {
		n    int
		want []int
	}{
		{0, nil},
		{1, nil},
		{2, nil},
		{3, []int{2}},
		{4, []int{2}},
		{5, []int{2, 4}},
		{7, []int{2, 4}},
		{8, []int{2, 4}},
		{9, []int{2, 4, 8}},
		{16, []int{2, 4, 8}},
		{17, []int{2, 4, 8, 16}},
		{64, []int{2, 4, 8, 16, 32}},
	}
	for _, tt := range tests {
		if got := GroupSizes(tt.n); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("GroupSizes(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

func TestAlignedGroupsFixtures(t *testing.T) {
	seq := func(lo, hi int) []int {
		var s []int
		for p := lo; p <= hi; p++ {
			s = append(s, p)
		}
		return s
	}
	tests := []struct {
		file string
		k    int
		want [][]int
		why  string
	}{
		{"v100-sxm2-8-aliyun-sccgn6.txt", 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}},
			"the only quads with NVLink between every pair"},
		{"v100-sxm2-8-aliyun-sccgn6.txt", 2, [][]int{{0, 3}, {1, 2}, {4, 7}, {5, 6}},
			"two perfect matchings use only NV2; this one is lexicographically smaller than {0,6},{1,7},{2,3},{4,5}"},
		{"v100-sxm2-8-aliyun-sccgn6.txt", 8, [][]int{seq(0, 7)}, "k == n: the whole node"},
		{"pcie-nvbridge-8.txt", 2, [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "the NV4 bridge pairs"},
		{"pcie-nvbridge-8.txt", 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}},
			"one socket each (PXB and NODE); any other quad crosses sockets (SYS)"},
		{"p40-pcie-7.txt", 2, [][]int{{0, 1}, {3, 4}, {5, 6}},
			"three PIX pairs need one from switch {0,1,2} and two from {3,4,5,6}; GPU2 is left over in the smallest"},
		{"p40-pcie-7.txt", 4, [][]int{{3, 4, 5, 6}},
			"the only all-PIX quad is the four-GPU switch; the other three are left over"},
		{"dgx-a100.txt", 2, [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "all NV12: the lexicographically smallest partition"},
		{"dgx-a100.txt", 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, "all NV12: the lexicographically smallest partition"},
		{"dgx-h100.txt", 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, "all NV18: the lexicographically smallest partition"},
		{"dgx2-16.txt", 8, [][]int{seq(0, 7), seq(8, 15)}, "all NV6: the lexicographically smallest partition"},
		{"pcie-16.txt", 4, [][]int{seq(0, 3), seq(4, 7), seq(8, 11), seq(12, 15)}, "one PCIe switch each (PIX)"},
		{"pcie-16.txt", 8, [][]int{seq(0, 7), seq(8, 15)}, "one socket each (NODE)"},
		{"pcie-4.txt", 2, [][]int{{0, 1}, {2, 3}}, "the PIX pairs"},
		{"synthetic-32.txt", 8, [][]int{seq(0, 7), seq(8, 15), seq(16, 23), seq(24, 31)}, "the NVLink islands (PXB inside, NODE or SYS across)"},
		{"synthetic-32.txt", 16, [][]int{seq(0, 15), seq(16, 31)}, "one socket each (NODE)"},
		{"synthetic-32.txt", 4, [][]int{
			seq(0, 3), seq(4, 7), seq(8, 11), seq(12, 15), seq(16, 19), seq(20, 23), seq(24, 27), seq(28, 31),
		}, "the all-NVLink quads of every island"},
		{"synthetic-32.txt", 2, [][]int{
			{0, 3}, {1, 2}, {4, 7}, {5, 6}, {8, 11}, {9, 10}, {12, 15}, {13, 14},
			{16, 19}, {17, 18}, {20, 23}, {21, 22}, {24, 27}, {25, 26}, {28, 31}, {29, 30},
		}, "NV2 pairs only; greedy alone would strand NV1 pairs, refinement repairs them"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/k=%d", tt.file, tt.k), func(t *testing.T) {
			topo := mustParseFile(t, tt.file)
			got := topo.AlignedGroups(tt.k)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("AlignedGroups(%d) = %v, want %v (%s)", tt.k, got, tt.want, tt.why)
			}
			checkGroupOf(t, topo, tt.k, got)
		})
	}
}

// checkGroupOf verifies GroupOf against a partition.
func checkGroupOf(t *testing.T, topo *Topology, k int, groups [][]int) {
	t.Helper()
	want := make(map[int]int)
	for id, g := range groups {
		for _, p := range g {
			want[p] = id
		}
	}
	for p := range topo.Len() {
		id, ok := topo.GroupOf(k, p)
		wantID, wantOK := want[p]
		if !wantOK {
			wantID = -1
		}
		if id != wantID || ok != wantOK {
			t.Errorf("GroupOf(%d, %d) = %d, %v; want %d, %v", k, p, id, ok, wantID, wantOK)
		}
	}
}

func TestAlignedGroupsEdgeCases(t *testing.T) {
	topo := mustParseFile(t, "pcie-4.txt")
	tests := []struct {
		k    int
		want [][]int
	}{
		{-1, nil},
		{0, nil},
		{1, [][]int{{0}, {1}, {2}, {3}}},
		{3, [][]int{{0, 1, 2}}},
		{4, [][]int{{0, 1, 2, 3}}},
		{5, nil},
	}
	for _, tt := range tests {
		got := topo.AlignedGroups(tt.k)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("AlignedGroups(%d) = %v, want %v", tt.k, got, tt.want)
		}
		checkGroupOf(t, topo, tt.k, got)
	}
	for _, p := range []int{-1, 4} {
		if id, ok := topo.GroupOf(2, p); ok || id != -1 {
			t.Errorf("GroupOf(2, %d) = %d, %v; want -1, false", p, id, ok)
		}
	}
	// The result is a copy: modifying it must not change later answers.
	got := topo.AlignedGroups(2)
	got[0][0] = 99
	if again := topo.AlignedGroups(2); again[0][0] != 0 {
		t.Errorf("AlignedGroups result aliases the cache: got %v after modifying a copy", again)
	}
}

// refPartition is the brute-force reference: every partition into
// len/k groups of k plus leftovers, ranked by the documented objective
// without any of the solver's encodings.
type refPartition struct {
	groups    [][]int
	weakest   []Link // ascending
	linkSum   int
	flattened []int
}

func (a refPartition) betterThan(b refPartition) bool {
	for i := range a.weakest {
		if a.weakest[i] != b.weakest[i] {
			return a.weakest[i] > b.weakest[i]
		}
	}
	if a.linkSum != b.linkSum {
		return a.linkSum > b.linkSum
	}
	return slices.Compare(a.flattened, b.flattened) < 0
}

func newRefPartition(topo *Topology, groups [][]int) refPartition {
	r := refPartition{groups: canonical(groups)}
	for _, g := range r.groups {
		r.weakest = append(r.weakest, topo.WeakestLink(g))
		r.linkSum += topo.LinkSum(g)
		r.flattened = append(r.flattened, g...)
	}
	slices.Sort(r.weakest)
	return r
}

func bruteForceGroups(topo *Topology, k int) [][]int {
	n := topo.Len()
	var best *refPartition
	var rec func(remaining []int, leftovers int, groups [][]int)
	rec = func(remaining []int, leftovers int, groups [][]int) {
		if len(remaining) == 0 {
			cand := newRefPartition(topo, groups)
			if best == nil || cand.betterThan(*best) {
				best = &cand
			}
			return
		}
		first, rest := remaining[0], remaining[1:]
		if leftovers > 0 {
			rec(rest, leftovers-1, groups)
		}
		if len(remaining) < k {
			return
		}
		var pick func(from int, g []int)
		pick = func(from int, g []int) {
			if len(g) == k {
				var others []int
				for _, p := range rest {
					if !slices.Contains(g, p) {
						others = append(others, p)
					}
				}
				rec(others, leftovers, append(groups, g))
				return
			}
			for i := from; i < len(rest); i++ {
				pick(i+1, append(slices.Clone(g), rest[i]))
			}
		}
		pick(0, []int{first})
	}
	all := make([]int, n)
	for p := range all {
		all[p] = p
	}
	rec(all, n%k, nil)
	return best.groups
}

// randomTopology draws a symmetric matrix from the given classes.
func randomTopology(t testing.TB, rng *rand.Rand, n int, classes []Link) *Topology {
	t.Helper()
	gpus := make([]GPU, n)
	links := make([][]Link, n)
	for i := range n {
		gpus[i] = GPU{Index: i, NUMANode: -1}
		links[i] = make([]Link, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			l := classes[rng.IntN(len(classes))]
			links[i][j], links[j][i] = l, l
		}
	}
	topo, err := New(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func TestAlignedGroupsMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	palettes := [][]Link{
		{LinkSYS, LinkPIX, NVLink(2)},                                   // many ties
		{LinkSYS, LinkNODE, LinkPHB, LinkPXB, LinkPIX, NVLink(1)},       // PCIe mix
		{LinkSYS, NVLink(1), NVLink(2), NVLink(4), NVLink(12), LinkPXB}, // NVLink mix
	}
	cases := 0
	for n := 2; n <= 9; n++ {
		for k := 2; k <= n; k++ {
			for _, palette := range palettes {
				for range 4 {
					topo := randomTopology(t, rng, n, palette)
					want := bruteForceGroups(topo, k)
					got := topo.AlignedGroups(k)
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("n=%d k=%d matrix:\n%v\nAlignedGroups = %v, brute force = %v",
							n, k, matrixOf(topo), got, want)
					}
					cases++
				}
			}
		}
	}
	t.Logf("%d random topologies agree with brute force", cases)

	for _, file := range []string{"v100-sxm2-8-aliyun-sccgn6.txt", "p40-pcie-7.txt", "pcie-nvbridge-8.txt", "pcie-4.txt", "dgx-a100.txt"} {
		topo := mustParseFile(t, file)
		for k := 1; k <= topo.Len(); k++ {
			if got, want := topo.AlignedGroups(k), bruteForceGroups(topo, k); !reflect.DeepEqual(got, want) {
				t.Errorf("%s k=%d: AlignedGroups = %v, brute force = %v", file, k, got, want)
			}
		}
	}
}

// TestHeuristicIsValid checks the >16 GPU path: a valid partition, stable
// across calls, and never worse than the greedy construction it refines.
func TestHeuristicIsValid(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	palette := []Link{LinkSYS, LinkNODE, LinkPIX, NVLink(1), NVLink(2), NVLink(4)}
	for _, n := range []int{17, 23, 32, 48, 64} {
		topo := randomTopology(t, rng, n, palette)
		for _, k := range []int{2, 3, 4, 8, 16, 32} {
			if k > n {
				continue
			}
			got := topo.AlignedGroups(k)
			if len(got) != n/k {
				t.Fatalf("n=%d k=%d: %d groups, want %d", n, k, len(got), n/k)
			}
			seen := make(map[int]bool)
			for i, g := range got {
				if len(g) != k || !slices.IsSorted(g) {
					t.Fatalf("n=%d k=%d: group %d = %v, want %d ascending positions", n, k, i, g, k)
				}
				if i > 0 && got[i-1][0] >= g[0] {
					t.Fatalf("n=%d k=%d: groups not ordered by lowest member: %v", n, k, got)
				}
				for _, p := range g {
					if p < 0 || p >= n || seen[p] {
						t.Fatalf("n=%d k=%d: position %d repeated or out of range in %v", n, k, p, got)
					}
					seen[p] = true
				}
			}
			greedy, _ := greedyGroups(topo, k)
			if g, r := newRefPartition(topo, greedy), newRefPartition(topo, got); !reflect.DeepEqual(g.weakest, r.weakest) || g.linkSum != r.linkSum {
				if g.betterThan(r) {
					t.Errorf("n=%d k=%d: refined partition scores worse than the greedy one", n, k)
				}
			}
			if again := solveHeuristic(topo, k); !reflect.DeepEqual(canonical(again), got) {
				t.Errorf("n=%d k=%d: heuristic is not deterministic", n, k)
			}
			checkGroupOf(t, topo, k, got)
		}
	}
}

func canonical(groups [][]int) [][]int {
	out := make([][]int, len(groups))
	for i, g := range groups {
		out[i] = slices.Sorted(slices.Values(g))
	}
	slices.SortFunc(out, func(a, b []int) int { return a[0] - b[0] })
	return out
}

func TestAlignedGroupsConcurrentReaders(t *testing.T) {
	topo := mustParseFile(t, "pcie-16.txt")
	want := make(map[int][][]int)
	for _, k := range []int{2, 4, 8} {
		want[k] = computeAligned(topo, k).groups
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := range 16 {
		k := []int{2, 4, 8}[i%3]
		wg.Go(func() {
			if got := topo.AlignedGroups(k); !reflect.DeepEqual(got, want[k]) {
				errs <- fmt.Sprintf("k=%d: %v, want %v", k, got, want[k])
			}
			if _, ok := topo.GroupOf(k, 0); !ok {
				errs <- fmt.Sprintf("k=%d: GPU0 in no group", k)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestAlignedGroupsExactIsFast guards the 16-GPU budget of the exact
// search with a bound loose enough for race-instrumented, shared CI runners.
func TestAlignedGroupsExactIsFast(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	palette := []Link{LinkSYS, LinkNODE, LinkPHB, LinkPXB, LinkPIX, NVLink(1), NVLink(2), NVLink(3), NVLink(4), NVLink(6), NVLink(12), NVLink(18)}
	topo := randomTopology(t, rng, 16, palette)
	for k := 2; k <= 16; k++ {
		start := time.Now()
		computeAligned(topo, k)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("k=%d: exact search took %v", k, d)
		}
	}
}

func BenchmarkAlignedGroups(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	random16 := randomTopology(b, rng, 16, []Link{LinkSYS, LinkNODE, LinkPXB, LinkPIX, NVLink(1), NVLink(2), NVLink(4), NVLink(12)})
	random15 := randomTopology(b, rng, 15, []Link{LinkSYS, LinkNODE, LinkPXB, LinkPIX, NVLink(1), NVLink(2), NVLink(4), NVLink(12)})
	random64 := randomTopology(b, rng, 64, []Link{LinkSYS, LinkNODE, LinkPXB, LinkPIX, NVLink(1), NVLink(2), NVLink(4), NVLink(12)})
	topos := []struct {
		name string
		topo *Topology
	}{
		{"dgx2-16", mustParseFile(b, "dgx2-16.txt")},
		{"pcie-16", mustParseFile(b, "pcie-16.txt")},
		{"random-16", random16},
		{"random-15", random15},
		{"synthetic-32", mustParseFile(b, "synthetic-32.txt")},
		{"random-64", random64},
	}
	for _, tc := range topos {
		for _, k := range append(GroupSizes(tc.topo.Len()), 3) {
			b.Run(fmt.Sprintf("%s/k=%d", tc.name, k), func(b *testing.B) {
				for b.Loop() {
					computeAligned(tc.topo, k)
				}
			})
		}
	}
}
