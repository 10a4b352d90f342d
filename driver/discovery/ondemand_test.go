package discovery

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/mig"
)

// mockMIGGPU discovers GPU 0 of a go-nvml mock server in MIG mode without
// instances.
func mockMIGGPU(t *testing.T, server string) *mig.GPU {
	t.Helper()
	d, err := NewMockWith(server, MockOptions{MIG: map[int][]string{0: {}}})
	if err != nil {
		t.Fatalf("NewMockWith(%s): %v", server, err)
	}
	topo, err := d.Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover(%s): %v", server, err)
	}
	g := topo.GPUs[0]
	if !g.MIGEnabled() {
		t.Fatalf("%s GPU 0 is not in MIG mode", server)
	}
	return g.MIG
}

// The profiles discovery reads for MIG on demand from the go-nvml mocks'
// A100 40GB and H100 80GB, and the counters derived from them. The mocks'
// tables are what they are (the H100's 1g.20gb placements are one memory
// slice wide): the counters follow NVML, and the memory counter keeps
// such a table from letting more instances exist than the memory holds.
func TestMockMIGProfiles(t *testing.T) {
	for _, c := range []struct {
		server     string
		placements map[string][]mig.Placement
		capacity   mig.Capacity
	}{{
		server: "dgxa100",
		placements: map[string][]mig.Placement{
			"1g.5gb":    placements(0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1),
			"2g.10gb":   placements(0, 2, 2, 2, 4, 2),
			"3g.20gb":   placements(0, 4, 4, 4),
			"4g.20gb":   placements(0, 4),
			"7g.40gb":   placements(0, 8),
			"1g.5gb+me": placements(0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1),
			"1g.10gb":   placements(0, 2, 2, 2, 4, 2, 6, 2),
		},
		capacity: mig.Capacity{MemorySlices: 8, ComputeSlices: 7, MemoryBytes: 40192 << 20, MaxInstances: map[int]int{7: 1}},
	}, {
		server: "dgxh100",
		placements: map[string][]mig.Placement{
			"1g.10gb":    placements(0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1),
			"2g.20gb":    placements(0, 2, 2, 2, 4, 2),
			"3g.40gb":    placements(0, 3, 4, 3),
			"4g.40gb":    placements(0, 4),
			"7g.80gb":    placements(0, 7),
			"1g.10gb+me": placements(0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1),
			"1g.20gb":    placements(0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1),
		},
		capacity: mig.Capacity{MemorySlices: 7, ComputeSlices: 7, MemoryBytes: 81920 << 20, MaxInstances: map[int]int{7: 1, 9: 4}},
	}} {
		t.Run(c.server, func(t *testing.T) {
			g := mockMIGGPU(t, c.server)
			if len(g.Profiles) != len(c.placements) {
				t.Errorf("%d profiles, want %d: %+v", len(g.Profiles), len(c.placements), g.Profiles)
			}
			lastID := -1
			for _, p := range g.Profiles {
				want, ok := c.placements[p.Profile.Name]
				if !ok {
					t.Errorf("unexpected profile %q", p.Profile.Name)
					continue
				}
				if !slices.Equal(p.Placements, want) {
					t.Errorf("profile %s: placements %v, want %v", p.Profile.Name, p.Placements, want)
				}
				if p.Profile.GIProfileID <= lastID {
					t.Errorf("profile %s (ID %d) out of order after ID %d", p.Profile.Name, p.Profile.GIProfileID, lastID)
				}
				lastID = p.Profile.GIProfileID
				if p.Profile.CISlices != p.Profile.GISlices || p.Profile.CIProfileID != -1 || p.Profile.MemoryBytes <= 0 || p.Profile.Multiprocessors <= 0 {
					t.Errorf("profile %s: %+v, want one compute instance over the whole GPU instance, CI profile -1, memory and SMs", p.Profile.Name, p.Profile)
				}
			}
			got := g.Capacity()
			if got.MemorySlices != c.capacity.MemorySlices || got.ComputeSlices != c.capacity.ComputeSlices || got.MemoryBytes != c.capacity.MemoryBytes || !maps.Equal(got.MaxInstances, c.capacity.MaxInstances) {
				t.Errorf("Capacity() = %+v, want %+v", got, c.capacity)
			}
			// Every partition alone fits, and the names are valid.
			for _, p := range g.Partitions() {
				if err := got.Fits([]mig.Partition{p}); err != nil {
					t.Errorf("%s at %v alone: %v", p.Profile.Name, p.Placement, err)
				}
			}
		})
	}
}

// Which sets of partitions the counters let exist side by side on the
// mocks' GPUs.
func TestMockMIGCapacityFits(t *testing.T) {
	type part struct {
		profile string
		start   int
	}
	for _, c := range []struct {
		name   string
		server string
		parts  []part
		err    string // "" fits
	}{
		{"A100 seven 1g.5gb", "dgxa100", []part{{"1g.5gb", 0}, {"1g.5gb", 1}, {"1g.5gb", 2}, {"1g.5gb", 3}, {"1g.5gb", 4}, {"1g.5gb", 5}, {"1g.5gb", 6}}, ""},
		{"A100 4g and 3g", "dgxa100", []part{{"4g.20gb", 0}, {"3g.20gb", 4}}, ""},
		{"A100 two 2g, 1g.10gb, 1g.10gb", "dgxa100", []part{{"2g.10gb", 0}, {"2g.10gb", 2}, {"1g.10gb", 4}, {"1g.10gb", 6}}, ""},
		{"A100 overlapping placements", "dgxa100", []part{{"3g.20gb", 0}, {"1g.5gb", 3}}, "overlaps"},
		{"A100 7g and anything", "dgxa100", []part{{"7g.40gb", 0}, {"1g.5gb", 6}}, "overlaps"},
		{"A100 two +me", "dgxa100", []part{{"1g.5gb+me", 0}, {"1g.5gb+me", 1}}, "2 instances of 1g.5gb+me, the GPU allows 1"},
		{"A100 compute slices", "dgxa100", []part{{"3g.20gb", 0}, {"2g.10gb", 4}, {"1g.10gb", 6}, {"1g.5gb", 4}}, "overlaps"},
		{"H100 seven 1g.10gb", "dgxh100", []part{{"1g.10gb", 0}, {"1g.10gb", 1}, {"1g.10gb", 2}, {"1g.10gb", 3}, {"1g.10gb", 4}, {"1g.10gb", 5}, {"1g.10gb", 6}}, ""},
		{"H100 4g and 3g", "dgxh100", []part{{"4g.40gb", 0}, {"3g.40gb", 4}}, ""},
		{"H100 five 1g.20gb", "dgxh100", []part{{"1g.20gb", 0}, {"1g.20gb", 1}, {"1g.20gb", 2}, {"1g.20gb", 3}, {"1g.20gb", 4}}, "5 instances of 1g.20gb, the GPU allows 4"},
		{"H100 memory", "dgxh100", []part{{"3g.40gb", 0}, {"1g.20gb", 4}, {"1g.20gb", 5}, {"1g.20gb", 6}}, "bytes of memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := mockMIGGPU(t, c.server)
			var parts []mig.Partition
			for _, p := range c.parts {
				pt, err := g.Partition(p.profile, p.start)
				if err != nil {
					t.Fatalf("Partition(%s, %d): %v", p.profile, p.start, err)
				}
				parts = append(parts, pt)
			}
			err := g.Capacity().Fits(parts)
			switch {
			case c.err == "" && err != nil:
				t.Errorf("Fits: %v, want nil", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Errorf("Fits: %v, want an error containing %q", err, c.err)
			}
		})
	}
	g := mockMIGGPU(t, "dgxa100")
	for _, c := range []struct {
		profile string
		start   int
		err     string
	}{
		{"2g.80gb", 0, `profile "2g.80gb": the GPU model has no such profile (it has 1g.5gb, 2g.10gb`},
		{"3g.20gb", 2, "profile 3g.20gb has no placement starting at memory slice 2 (its placements start at 0, 4)"},
	} {
		if _, err := g.Partition(c.profile, c.start); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Partition(%s, %d) = %v, want an error containing %q", c.profile, c.start, err, c.err)
		}
	}
}

// placements builds placements from start, size pairs.
func placements(pairs ...int) []mig.Placement {
	out := make([]mig.Placement, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, mig.Placement{Start: pairs[i], Size: pairs[i+1]})
	}
	return out
}
