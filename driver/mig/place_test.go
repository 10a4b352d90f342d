package mig_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
)

// mockTable is the placement table of GPU 0 of a go-nvml mock server
// (dgxa100: A100 40GB, dgxh100: H100 80GB) in MIG mode.
func mockTable(tb testing.TB, server string) (*mig.Table, *mig.GPU) {
	tb.Helper()
	topo, err := discovery.MockTopology(server, discovery.MockOptions{MIG: map[int][]string{0: nil}})
	if err != nil {
		tb.Fatalf("MockTopology(%s): %v", server, err)
	}
	g := topo.GPUs[0].MIG
	t, err := mig.NewTable(g.Capacity(), g.Partitions())
	if err != nil {
		tb.Fatalf("NewTable(%s): %v", server, err)
	}
	return t, g
}

func part(tb testing.TB, t *mig.Table, name string, start int) mig.Part {
	tb.Helper()
	p, ok := t.Find(name, start)
	if !ok {
		tb.Fatalf("no partition %s at %d", name, start)
	}
	return p
}

func TestHeadroom(t *testing.T) {
	for _, c := range []struct {
		server string
		placed []string // profile@start
		want   string
	}{
		{"dgxa100", nil, "a 7g, a 4g, 2 3g, 3 2g, 7 1g"},
		// A 1g at slice 6 leaves slices 0-3 whole: a 4g or a 3g there.
		{"dgxa100", []string{"1g.5gb@6"}, "a 4g, a 3g, 3 2g, 6 1g"},
		// At slice 0 it leaves no 4g.
		{"dgxa100", []string{"1g.5gb@0"}, "a 3g, 2 2g, 6 1g"},
		{"dgxa100", []string{"4g.20gb@0", "3g.20gb@4"}, "nothing"},
		// 1g.10gb takes 2 memory slices; four fill the GPU's memory.
		{"dgxa100", []string{"1g.10gb@0", "1g.10gb@2", "1g.10gb@4"}, "a 1g"},
		{"dgxh100", nil, "a 7g, a 4g, 2 3g, 3 2g, 7 1g"},
		{"dgxh100", []string{"1g.10gb@6"}, "a 4g, a 3g, 3 2g, 6 1g"},
		// The H100 mock's 3g placements take 3 of its 7 memory slices.
		{"dgxh100", []string{"3g.40gb@0"}, "a 3g, a 2g, 4 1g"},
	} {
		tab, _ := mockTable(t, c.server)
		var s mig.State
		for _, p := range c.placed {
			name, start := splitAt(t, p)
			pt := part(t, tab, name, start)
			if !tab.Fits(s, pt) {
				t.Fatalf("%s %v: %s does not fit", c.server, c.placed, p)
			}
			s = tab.Add(s, pt)
		}
		if got := tab.Headroom(s).String(); got != c.want {
			t.Errorf("%s with %v: headroom %q, want %q", c.server, c.placed, got, c.want)
		}
	}
}

func splitAt(tb testing.TB, s string) (string, int) {
	tb.Helper()
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '@' {
			n := 0
			for _, r := range s[i+1:] {
				n = n*10 + int(r-'0')
			}
			return s[:i], n
		}
	}
	tb.Fatalf("%q: want profile@start", s)
	return "", 0
}

// candidates lists every placement of profile on every GPU.
func candidates(gpus []mig.GPUState, profile string) []mig.Candidate {
	var out []mig.Candidate
	for g := range gpus {
		t := gpus[g].Table
		for i := range t.Profiles {
			if t.Profiles[i].Name != profile {
				continue
			}
			for j := range t.Profiles[i].Placements {
				out = append(out, mig.Candidate{GPU: g, Part: mig.Part{Profile: i, Placement: j}})
			}
		}
	}
	return out
}

func TestChooseLookAhead(t *testing.T) {
	for _, c := range []struct {
		name    string
		server  string
		placed  map[int][]string // by GPU
		request string
		policy  mig.Policy
		gpu     int
		start   int
	}{
		// On an empty A100 a 1g goes to slice 6, keeping the 4g possible;
		// first fit takes slice 0.
		{"a100 1g look-ahead", "dgxa100", nil, "1g.5gb", mig.LookAhead, 0, 6},
		{"a100 1g first fit", "dgxa100", nil, "1g.5gb", mig.FirstFit, 0, 0},
		// A 2g at 4 keeps slices 0-3 (a 4g) whole.
		{"a100 2g", "dgxa100", nil, "2g.10gb", mig.LookAhead, 0, 4},
		// A 3g takes slices 4-7: at 0 it rules out the 4g as well.
		{"a100 3g", "dgxa100", nil, "3g.20gb", mig.LookAhead, 0, 4},
		// GPU 1 already has a 1g at 6: the next 1g packs there (losing a
		// 1g and a 2g of GPU 1 beats losing GPU 0's 7g), and at slice 4,
		// as slices 0-3 keep the 4g.
		{"a100 pack", "dgxa100", map[int][]string{1: {"1g.5gb@6"}}, "1g.5gb", mig.LookAhead, 1, 4},
		// First fit ignores the partitioned GPU.
		{"a100 pack first fit", "dgxa100", map[int][]string{1: {"1g.5gb@6"}}, "1g.5gb", mig.FirstFit, 0, 0},
		// Best fit packs, at the lowest placement.
		{"a100 pack best fit", "dgxa100", map[int][]string{1: {"1g.5gb@6"}}, "1g.5gb", mig.BestFit, 1, 0},
		// A 4g on a GPU with a 3g at 4 fills it, rather than taking a
		// whole GPU.
		{"a100 4g fills", "dgxa100", map[int][]string{1: {"3g.20gb@4"}}, "4g.20gb", mig.LookAhead, 1, 0},
		{"h100 1g", "dgxh100", nil, "1g.10gb", mig.LookAhead, 0, 6},
		{"h100 3g", "dgxh100", nil, "3g.40gb", mig.LookAhead, 0, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab, _ := mockTable(t, c.server)
			gpus := make([]mig.GPUState, 2)
			for g := range gpus {
				gpus[g] = mig.GPUState{Index: g, Table: tab}
				for _, p := range c.placed[g] {
					name, start := splitAt(t, p)
					gpus[g].State = tab.Add(gpus[g].State, part(t, tab, name, start))
				}
			}
			ch, ok := mig.Choose(c.policy, gpus, candidates(gpus, c.request))
			if !ok {
				t.Fatal("nothing chosen")
			}
			got := tab.Placement(ch.Candidate.Part)
			if ch.Candidate.GPU != c.gpu || got.Start != c.start {
				t.Errorf("chose GPU %d slice %d (keeps %s), want GPU %d slice %d", ch.Candidate.GPU, got.Start, ch.After, c.gpu, c.start)
			}
		})
	}
}

// A 7g does not fit beside a 1g, whichever policy.
func TestChooseNothingFits(t *testing.T) {
	tab, _ := mockTable(t, "dgxa100")
	gpus := []mig.GPUState{{Index: 0, Table: tab, State: tab.Add(mig.State{}, part(t, tab, "1g.5gb", 6))}}
	for _, p := range []mig.Policy{mig.LookAhead, mig.FirstFit, mig.BestFit} {
		if ch, ok := mig.Choose(p, gpus, candidates(gpus, "7g.40gb")); ok {
			t.Errorf("%s: chose %+v for a 7g beside a 1g", p, ch)
		}
	}
}

// The Table's rule is the counters' rule: for random sets of partitions,
// adding them one by one while Fits agrees exactly with Capacity.Fits on
// the set.
func TestTableFitsMatchesCapacity(t *testing.T) {
	for _, server := range []string{"dgxa100", "dgxh100"} {
		tab, g := mockTable(t, server)
		parts := g.Partitions()
		c := g.Capacity()
		rng := rand.New(rand.NewPCG(7, 11))
		for range 2000 {
			var s mig.State
			var set []mig.Partition
			for range 1 + rng.IntN(8) {
				p := parts[rng.IntN(len(parts))]
				pt := part(t, tab, p.Profile.Name, p.Placement.Start)
				err := c.Fits(append(set, p))
				if fits := tab.Fits(s, pt); fits != (err == nil) {
					t.Fatalf("%s: adding %s@%d to %v: Table.Fits %v, Capacity.Fits %v", server, p.Profile.Name, p.Placement.Start, set, fits, err)
				}
				if err == nil {
					s = tab.Add(s, pt)
					set = append(set, p)
				}
			}
			for i := len(set) - 1; i >= 0; i-- {
				s = tab.Remove(s, part(t, tab, set[i].Profile.Name, set[i].Placement.Start))
			}
			if s != (mig.State{}) {
				t.Fatalf("%s: removing what was added leaves %+v", server, s)
			}
		}
	}
}

func TestNewTableErrors(t *testing.T) {
	_, g := mockTable(t, "dgxa100")
	parts := g.Partitions()
	c := g.Capacity()
	bad := append([]mig.Partition{}, parts...)
	bad = append(bad, parts[0])
	if _, err := mig.NewTable(c, bad); err == nil {
		t.Error("a partition listed twice was accepted")
	}
	small := c
	small.MemorySlices = 4
	if _, err := mig.NewTable(small, parts); err == nil {
		t.Error("a placement outside the memory slices was accepted")
	}
	odd := append([]mig.Partition{}, parts...)
	odd[1].Profile.MemoryBytes++
	if _, err := mig.NewTable(c, odd); err == nil {
		t.Error("partitions of one profile with different memory were accepted")
	}
}
