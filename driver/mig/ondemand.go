package mig

import (
	"fmt"
	"slices"
	"strings"
)

// MIG on demand.
//
// A GPU in MIG mode that the kubelet plugin is told to partition on demand
// (GPU.OnDemand) is published as every partition it could be cut into:
// each GPU instance profile the GPU supports at each placement NVML allows
// for it. The partitions consume counters of one counter set per GPU
// (KEP-4815, partitionable devices): one counter per memory slice, so that
// two partitions whose placements overlap can never both be allocated, and
// the compute slices and media engines the GPU has, so that no set of
// partitions asks more of them than the GPU has. The kubelet plugin
// creates a partition's GPU instance (and one compute instance over all of
// it) when a claim that got it is prepared, and destroys it when the claim
// is unprepared.

// GIProfile is a GPU instance profile a GPU in MIG mode supports and the
// placements NVML allows for it. Its Profile describes the GPU instance
// with one compute instance over all of it (CISlices == GISlices), the
// only shape MIG on demand creates; CIProfileID is -1, as NVML tells the
// compute instance profiles only of a GPU instance that exists.
type GIProfile struct {
	Profile    Profile     `json:"profile"`
	Placements []Placement `json:"placements"`
	// MaxInstances is how many instances of the profile the GPU can have
	// at once (NVML's InstanceCount); 0: unknown.
	MaxInstances int `json:"maxInstances,omitempty"`
}

// Partition is one GPU instance profile at one of its placements: what a
// claim gets from a GPU partitioned on demand.
type Partition struct {
	Profile   Profile   `json:"profile"`
	Placement Placement `json:"placement"`
}

// Partitions lists every partition of the GPU's profiles, by profile (in
// the order of Profiles) then placement start.
func (g *GPU) Partitions() []Partition {
	var out []Partition
	for _, p := range g.Profiles {
		for _, pl := range p.Placements {
			out = append(out, Partition{Profile: p.Profile, Placement: pl})
		}
	}
	return out
}

// Partition finds the partition of profile name at the placement starting
// at start, with an error that says what the GPU has instead.
func (g *GPU) Partition(name string, start int) (Partition, error) {
	names := make([]string, 0, len(g.Profiles))
	for _, p := range g.Profiles {
		names = append(names, p.Profile.Name)
		if p.Profile.Name != name {
			continue
		}
		starts := make([]string, 0, len(p.Placements))
		for _, pl := range p.Placements {
			if pl.Start == start {
				return Partition{Profile: p.Profile, Placement: pl}, nil
			}
			starts = append(starts, fmt.Sprint(pl.Start))
		}
		return Partition{}, fmt.Errorf("profile %s has no placement starting at memory slice %d (its placements start at %s)", name, start, strings.Join(starts, ", "))
	}
	if len(names) == 0 {
		return Partition{}, fmt.Errorf("profile %q: the GPU reports no MIG profiles", name)
	}
	return Partition{}, fmt.Errorf("profile %q: the GPU model has no such profile (it has %s)", name, strings.Join(names, ", "))
}

// Capacity is what a GPU in MIG mode has for its partitions to share: the
// counters of its counter set.
type Capacity struct {
	// MemorySlices is the number of memory slices (8 on an A100): the end
	// of the furthest placement.
	MemorySlices int `json:"memorySlices"`
	// ComputeSlices is the most compute slices one GPU instance can have
	// (7 on an A100 or an H100): the full GPU instance's.
	ComputeSlices int `json:"computeSlices"`
	// MemoryBytes is the most memory one GPU instance can have: the full
	// GPU instance's. Instances side by side have disjoint memory slices,
	// so never more between them; counting it too keeps a profile whose
	// placements NVML reports narrower than its memory from being placed
	// more often than the memory allows.
	MemoryBytes int64 `json:"memoryBytes"`
	// MaxInstances limits the instances of the profiles NVML allows fewer
	// of than they have placements (an A100's 1g.5gb+me: one, as the GPU
	// has one set of the media engines it takes), by profile ID.
	MaxInstances map[int]int `json:"maxInstances,omitempty"`
}

// Capacity derives the GPU's counters from its profiles; zero for a GPU
// without profiles.
func (g *GPU) Capacity() Capacity {
	var c Capacity
	for _, p := range g.Profiles {
		c.ComputeSlices = max(c.ComputeSlices, p.Profile.GISlices)
		c.MemoryBytes = max(c.MemoryBytes, p.Profile.MemoryBytes)
		for _, pl := range p.Placements {
			c.MemorySlices = max(c.MemorySlices, pl.End())
		}
		if p.MaxInstances > 0 && p.MaxInstances < len(p.Placements) {
			if c.MaxInstances == nil {
				c.MaxInstances = map[int]int{}
			}
			c.MaxInstances[p.Profile.GIProfileID] = p.MaxInstances
		}
	}
	return c
}

// Fits reports whether the partitions can exist side by side on the GPU
// as its counters count them: no two placements overlap, and compute
// slices, memory and instances of each profile add up to no more than the
// GPU has. It is the rule the API's counters enforce, in Go, for tests and
// for the kubelet plugin's last check before creating an instance.
func (c Capacity) Fits(parts []Partition) error {
	compute := 0
	var memory int64
	instances := map[int]int{}
	for i, p := range parts {
		if p.Placement.Start < 0 || p.Placement.Size <= 0 || p.Placement.End() > c.MemorySlices {
			return fmt.Errorf("%s at %d+%d is outside the GPU's %d memory slices", p.Profile.Name, p.Placement.Start, p.Placement.Size, c.MemorySlices)
		}
		for _, q := range parts[:i] {
			if p.Placement.Overlaps(q.Placement) {
				return fmt.Errorf("%s at %d+%d overlaps %s at %d+%d", p.Profile.Name, p.Placement.Start, p.Placement.Size, q.Profile.Name, q.Placement.Start, q.Placement.Size)
			}
		}
		compute += p.Profile.GISlices
		memory += p.Profile.MemoryBytes
		instances[p.Profile.GIProfileID]++
		if limit, ok := c.MaxInstances[p.Profile.GIProfileID]; ok && instances[p.Profile.GIProfileID] > limit {
			return fmt.Errorf("%d instances of %s, the GPU allows %d", instances[p.Profile.GIProfileID], p.Profile.Name, limit)
		}
	}
	if compute > c.ComputeSlices {
		return fmt.Errorf("%d compute slices, the GPU has %d", compute, c.ComputeSlices)
	}
	if memory > c.MemoryBytes {
		return fmt.Errorf("%d bytes of memory, the GPU's instances have %d", memory, c.MemoryBytes)
	}
	return nil
}

// SortProfiles orders profiles by NVML profile ID, each one's placements
// by start, so that what is published from them is stable.
func SortProfiles(ps []GIProfile) {
	slices.SortFunc(ps, func(a, b GIProfile) int { return a.Profile.GIProfileID - b.Profile.GIProfileID })
	for i := range ps {
		slices.SortFunc(ps[i].Placements, func(a, b Placement) int { return a.Start - b.Start })
	}
}
