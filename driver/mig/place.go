package mig

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// Placement of partitions on GPUs partitioned on demand.
//
// Which partition to give a request matters: a 1g instance at memory
// slice 0 of an A100 rules out its 4g and 7g profiles, at slice 6 it
// leaves a 4g (slices 0-3) possible. Placing without looking ahead
// fragments GPUs so that the large profiles find no room although enough
// slices are free (the MIG fragmentation problem). The look-ahead policy
// scores each feasible placement by what the GPU could still host after it:
// its Headroom, the most instances of each size (compute slices) still
// placeable, compared from the largest size down. A placement loses what
// the GPU's headroom drops by; the least loss wins, then a GPU that
// already has partitions (packing keeps empty GPUs whole), then the lowest
// GPU index and placement start, so that decisions are reproducible.

// maxTableProfiles bounds the profiles of one GPU model; a State keeps
// their instance counts in a fixed array so that it is a plain value.
const maxTableProfiles = 24

// MaxComputeSlices is the most compute slices a MIG profile has on the GPUs
// gpulink knows (7 on A100, H100, H200, B200); Headroom is indexed by them.
const MaxComputeSlices = 8

// Table is one GPU's partitions as placement reads them: its capacity and
// each profile's placements, profiles ordered largest first (compute
// slices, then memory, then name).
type Table struct {
	Capacity Capacity
	Profiles []TableProfile
}

// TableProfile is one profile of a Table.
type TableProfile struct {
	Name          string
	ComputeSlices int
	MemoryBytes   int64
	// Limit is how many instances of the profile the GPU allows at once;
	// 0 when only its placements and the GPU's capacity limit them.
	Limit      int
	Placements []Placement
	masks      []uint64
}

// Part is one partition of a Table: a profile at one of its placements,
// by their positions in the Table.
type Part struct {
	Profile, Placement int
}

// State is what a GPU's allocated partitions take: its memory slices (a
// bit each), compute slices, memory and instances per profile of the
// Table. The zero value is an empty GPU. It is a plain value: copies are
// independent.
type State struct {
	Occupied  uint64
	Compute   int
	Memory    int64
	Instances [maxTableProfiles]uint8
}

// NewTable builds the Table of a GPU with capacity c and the partitions
// parts (each profile at each of its placements, as Partitions lists
// them). Partitions of one profile name must agree on compute slices and
// memory.
func NewTable(c Capacity, parts []Partition) (*Table, error) {
	if c.MemorySlices <= 0 || c.MemorySlices > 64 {
		return nil, fmt.Errorf("MIG capacity: %d memory slices, want 1 to 64", c.MemorySlices)
	}
	t := &Table{Capacity: c}
	byName := map[string]int{}
	for _, p := range parts {
		if p.Placement.Start < 0 || p.Placement.Size <= 0 || p.Placement.End() > c.MemorySlices {
			return nil, fmt.Errorf("partition %s at %d+%d: outside the GPU's %d memory slices", p.Profile.Name, p.Placement.Start, p.Placement.Size, c.MemorySlices)
		}
		if p.Profile.GISlices <= 0 || p.Profile.GISlices >= MaxComputeSlices {
			return nil, fmt.Errorf("partition %s: %d compute slices, want 1 to %d", p.Profile.Name, p.Profile.GISlices, MaxComputeSlices-1)
		}
		i, ok := byName[p.Profile.Name]
		if !ok {
			i = len(t.Profiles)
			byName[p.Profile.Name] = i
			tp := TableProfile{Name: p.Profile.Name, ComputeSlices: p.Profile.GISlices, MemoryBytes: p.Profile.MemoryBytes}
			if limit, limited := c.MaxInstances[p.Profile.GIProfileID]; limited {
				tp.Limit = limit
			}
			t.Profiles = append(t.Profiles, tp)
		}
		tp := &t.Profiles[i]
		if tp.ComputeSlices != p.Profile.GISlices || tp.MemoryBytes != p.Profile.MemoryBytes {
			return nil, fmt.Errorf("partitions of profile %s disagree: %d compute slices and %d bytes, then %d and %d", p.Profile.Name, tp.ComputeSlices, tp.MemoryBytes, p.Profile.GISlices, p.Profile.MemoryBytes)
		}
		if slices.Contains(tp.Placements, p.Placement) {
			return nil, fmt.Errorf("partition %s at %d+%d is listed twice", p.Profile.Name, p.Placement.Start, p.Placement.Size)
		}
		tp.Placements = append(tp.Placements, p.Placement)
	}
	if len(t.Profiles) > maxTableProfiles {
		return nil, fmt.Errorf("%d MIG profiles, at most %d supported", len(t.Profiles), maxTableProfiles)
	}
	slices.SortStableFunc(t.Profiles, func(a, b TableProfile) int {
		return cmp.Or(-cmp.Compare(a.ComputeSlices, b.ComputeSlices), -cmp.Compare(a.MemoryBytes, b.MemoryBytes), cmp.Compare(a.Name, b.Name))
	})
	for i := range t.Profiles {
		tp := &t.Profiles[i]
		slices.SortFunc(tp.Placements, func(a, b Placement) int { return a.Start - b.Start })
		tp.masks = make([]uint64, len(tp.Placements))
		for j, pl := range tp.Placements {
			tp.masks[j] = mask(pl)
		}
	}
	return t, nil
}

func mask(p Placement) uint64 {
	if p.Size >= 64 {
		return ^uint64(0)
	}
	return ((uint64(1) << p.Size) - 1) << p.Start
}

// Find returns the Part of profile name at the placement starting at start.
func (t *Table) Find(name string, start int) (Part, bool) {
	for i := range t.Profiles {
		if t.Profiles[i].Name != name {
			continue
		}
		for j, pl := range t.Profiles[i].Placements {
			if pl.Start == start {
				return Part{Profile: i, Placement: j}, true
			}
		}
	}
	return Part{}, false
}

// Placement returns a Part's placement.
func (t *Table) Placement(p Part) Placement { return t.Profiles[p.Profile].Placements[p.Placement] }

// Fits reports whether the partition can be added to a GPU in state s: its
// memory slices are free and the compute slices, memory and instances of
// its profile stay within the GPU's. It is the rule the GPU's counters
// enforce (Capacity.Fits), on a State.
func (t *Table) Fits(s State, p Part) bool {
	tp := &t.Profiles[p.Profile]
	return s.Occupied&tp.masks[p.Placement] == 0 &&
		s.Compute+tp.ComputeSlices <= t.Capacity.ComputeSlices &&
		s.Memory+tp.MemoryBytes <= t.Capacity.MemoryBytes &&
		(tp.Limit == 0 || int(s.Instances[p.Profile]) < tp.Limit)
}

// Add returns s with the partition added; the caller checked Fits.
func (t *Table) Add(s State, p Part) State {
	tp := &t.Profiles[p.Profile]
	s.Occupied |= tp.masks[p.Placement]
	s.Compute += tp.ComputeSlices
	s.Memory += tp.MemoryBytes
	s.Instances[p.Profile]++
	return s
}

// Remove returns s without the partition, which Add added.
func (t *Table) Remove(s State, p Part) State {
	tp := &t.Profiles[p.Profile]
	s.Occupied &^= tp.masks[p.Placement]
	s.Compute -= tp.ComputeSlices
	s.Memory -= tp.MemoryBytes
	s.Instances[p.Profile]--
	return s
}

// Headroom is what a GPU could still host: by compute slices (index 1 to
// MaxComputeSlices-1), the most instances of one profile of that size that
// still fit beside its partitions. It is compared from the largest size
// down: more large instances possible is better, whatever the small ones.
type Headroom [MaxComputeSlices]int

// Compare orders headrooms: +1 when h keeps more of the largest size where
// they differ, -1 when fewer, 0 when equal.
func (h Headroom) Compare(o Headroom) int {
	for k := MaxComputeSlices - 1; k > 0; k-- {
		if c := cmp.Compare(h[k], o[k]); c != 0 {
			return c
		}
	}
	return 0
}

// Minus is h less o, size by size.
func (h Headroom) Minus(o Headroom) Headroom {
	for k := range h {
		h[k] -= o[k]
	}
	return h
}

// String names the sizes still possible, largest first, e.g.
// "a 4g, a 3g, 3 2g, 6 1g"; "nothing" when none is.
func (h Headroom) String() string {
	var parts []string
	for k := MaxComputeSlices - 1; k > 0; k-- {
		switch {
		case h[k] == 1:
			parts = append(parts, "a "+strconv.Itoa(k)+"g")
		case h[k] > 1:
			parts = append(parts, strconv.Itoa(h[k])+" "+strconv.Itoa(k)+"g")
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// Largest is the headroom's largest sizes, at most n of them, as String
// prints them.
func (h Headroom) Largest(n int) string {
	var out Headroom
	for k := MaxComputeSlices - 1; k > 0 && n > 0; k-- {
		if h[k] > 0 {
			out[k] = h[k]
			n--
		}
	}
	return out.String()
}

// Headroom is what a GPU in state s could still host (see Headroom). Each
// profile's count is exact for its placements (all of one size, so taking
// free ones by start is a largest disjoint set) and then capped by the
// GPU's compute slices, memory and the profile's instance limit.
func (t *Table) Headroom(s State) Headroom {
	var h Headroom
	computeLeft := t.Capacity.ComputeSlices - s.Compute
	memoryLeft := t.Capacity.MemoryBytes - s.Memory
	for i := range t.Profiles {
		tp := &t.Profiles[i]
		if tp.ComputeSlices > computeLeft || tp.MemoryBytes > memoryLeft || h[tp.ComputeSlices] >= len(tp.Placements) {
			continue
		}
		n := 0
		taken := s.Occupied
		for _, m := range tp.masks {
			if taken&m == 0 {
				taken |= m
				n++
			}
		}
		n = min(n, computeLeft/tp.ComputeSlices)
		if tp.MemoryBytes > 0 {
			n = int(min(int64(n), memoryLeft/tp.MemoryBytes))
		}
		if tp.Limit > 0 {
			n = min(n, tp.Limit-int(s.Instances[i]))
		}
		h[tp.ComputeSlices] = max(h[tp.ComputeSlices], n)
	}
	return h
}

// Policy chooses among feasible placements.
type Policy int

const (
	// LookAhead keeps the largest profiles possible: least Headroom lost,
	// then a GPU already partitioned, then lowest GPU and start.
	LookAhead Policy = iota
	// FirstFit takes the lowest GPU index, then the lowest placement:
	// what an allocator that walks devices in order does.
	FirstFit
	// BestFit packs without looking ahead: the GPU with the fewest free
	// memory slices that fits, then the lowest placement, then GPU index.
	BestFit
)

func (p Policy) String() string {
	switch p {
	case LookAhead:
		return "look-ahead"
	case FirstFit:
		return "first-fit"
	case BestFit:
		return "best-fit"
	}
	return "policy-" + strconv.Itoa(int(p))
}

// Candidate is a partition a request may get: Part of GPU (an index into
// the GPUs given to Choose).
type Candidate struct {
	GPU  int
	Part Part
}

// GPUState is one GPU as Choose sees it: its Table and State, and its
// index (for ties and for what the events print).
type GPUState struct {
	Index int
	Table *Table
	State State
}

// Choice is a chosen candidate and why: the headroom of its GPU before
// and after.
type Choice struct {
	Candidate     Candidate
	Before, After Headroom
}

// Choose picks, by policy, one of the candidates that fit their GPU's
// state; false when none fits. It allocates nothing (candidates and gpus
// are read only).
func Choose(policy Policy, gpus []GPUState, cands []Candidate) (Choice, bool) {
	best := -1
	var bestKey chooseKey
	var before [64]Headroom
	var known uint64
	for i, c := range cands {
		g := &gpus[c.GPU]
		if !g.Table.Fits(g.State, c.Part) {
			continue
		}
		k := chooseKey{gpu: g.Index, start: g.Table.Placement(c.Part).Start, busy: g.State.Occupied != 0}
		switch policy {
		case LookAhead:
			if c.GPU < 64 && known&(1<<c.GPU) == 0 {
				before[c.GPU] = g.Table.Headroom(g.State)
				known |= 1 << c.GPU
			}
			var b Headroom
			if c.GPU < 64 {
				b = before[c.GPU]
			} else {
				b = g.Table.Headroom(g.State)
			}
			k.after = g.Table.Headroom(g.Table.Add(g.State, c.Part))
			k.loss = b.Minus(k.after)
		case BestFit:
			k.free = g.Table.Capacity.MemorySlices - bits.OnesCount64(g.State.Occupied)
		}
		if best < 0 || k.less(policy, bestKey) {
			best, bestKey = i, k
		}
	}
	if best < 0 {
		return Choice{}, false
	}
	c := cands[best]
	g := &gpus[c.GPU]
	ch := Choice{Candidate: c, Before: g.Table.Headroom(g.State)}
	ch.After = g.Table.Headroom(g.Table.Add(g.State, c.Part))
	return ch, true
}

type chooseKey struct {
	loss, after Headroom
	busy        bool
	free        int
	gpu, start  int
}

func (a chooseKey) less(policy Policy, b chooseKey) bool {
	switch policy {
	case LookAhead:
		if c := a.loss.Compare(b.loss); c != 0 {
			return c < 0
		}
		if a.busy != b.busy {
			return a.busy
		}
	case BestFit:
		if a.free != b.free {
			return a.free < b.free
		}
		if a.start != b.start {
			return a.start < b.start
		}
	}
	if a.gpu != b.gpu {
		return a.gpu < b.gpu
	}
	return a.start < b.start
}
