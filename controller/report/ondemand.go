package report

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// OnDemandGPU is the MIG layout of a GPU partitioned on demand (MIG on
// demand): the partitions claims hold, the memory slices left free and
// the largest instances that still fit, as the controller's placement
// sees them.
type OnDemandGPU struct {
	Index int `json:"index"`
	// MemorySlices is the GPU's number of memory slices.
	MemorySlices int `json:"memorySlices"`
	// Partitions are the held partitions, by placement; one held by more
	// than one claim, or overlapping another, is named in Problems.
	Partitions []MIG `json:"partitions,omitempty"`
	// FreeSlices are the memory slices no held partition takes.
	FreeSlices []int `json:"freeSlices"`
	// Possible says the most instances of each size (compute slices)
	// that still fit beside the held partitions, largest first: "a 4g,
	// a 3g, 3 2g, 6 1g" (mig.Headroom).
	Possible string   `json:"possible"`
	Problems []string `json:"problems,omitempty"`

	table *mig.Table
	all   []MIG // every partition, until settleOnDemand keeps the held
}

// onDemandReports are the pool's GPUs partitioned on demand before their
// holders are counted: every partition is listed so that holds find it.
func onDemandReports(n *sliceformat.Pool) ([]OnDemandGPU, error) {
	out := make([]OnDemandGPU, 0, len(n.OnDemand))
	for i := range n.OnDemand {
		g := &n.OnDemand[i]
		t, err := g.Table()
		if err != nil {
			return nil, err
		}
		r := OnDemandGPU{Index: g.Index, MemorySlices: g.Capacity.MemorySlices, table: t}
		for _, p := range g.Partitions {
			m := MIG{Device: p.Device.Name, Parent: p.Parent, Profile: p.Profile,
				PlacementStart: p.Placement.Start, PlacementSize: p.Placement.Size, MemoryBytes: p.MemoryBytes}
			m.Taints, m.Tainted = taints(p.Device.Taints)
			r.all = append(r.all, m)
		}
		out = append(out, r)
	}
	return out, nil
}

// settleOnDemand keeps the held partitions and derives the free slices and
// what still fits, counting each held partition once, as the controller's
// ledger does.
func settleOnDemand(g *OnDemandGPU) {
	var s mig.State
	for _, m := range g.all {
		if len(m.Holders) == 0 && len(m.Problems) == 0 {
			continue
		}
		slices.SortFunc(m.Holders, compareClaims)
		if len(m.Holders) > 1 {
			m.Problems = append(m.Problems, fmt.Sprintf("held by %d claims", len(m.Holders)))
		}
		if part, ok := g.table.Find(m.Profile, m.PlacementStart); ok {
			if !g.table.Fits(s, part) {
				g.Problems = append(g.Problems, fmt.Sprintf("%s does not fit beside the other held partitions (overlap or counters exceeded)", m.Device))
			}
			s = g.table.Add(s, part)
		}
		g.Partitions = append(g.Partitions, m)
	}
	slices.SortFunc(g.Partitions, func(a, b MIG) int {
		return cmp.Or(cmp.Compare(a.PlacementStart, b.PlacementStart), cmp.Compare(a.Device, b.Device))
	})
	g.FreeSlices = []int{}
	for k := range g.MemorySlices {
		if s.Occupied&(1<<k) == 0 {
			g.FreeSlices = append(g.FreeSlices, k)
		}
	}
	g.Possible = g.table.Headroom(s).String()
	g.all = nil
}

// SliceRanges prints memory slices as ranges: "0-5,7"; "none" when empty.
func SliceRanges(ks []int) string {
	if len(ks) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(ks); {
		j := i
		for j+1 < len(ks) && ks[j+1] == ks[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ks[i]))
		} else {
			parts = append(parts, strconv.Itoa(ks[i])+"-"+strconv.Itoa(ks[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
