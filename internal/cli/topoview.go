package cli

import (
	"fmt"
	"strconv"

	"github.com/gpulink/gpulink/driver/topology"
)

// topologyView is everything `gpulink topology` reports about one node, in
// GPU indices (what nvidia-smi and users see) rather than positions. Its
// JSON form is the command's --output json.
type topologyView struct {
	GPUs []gpuView `json:"gpus"`
	// Links is the link matrix in GPU order, "X" on the diagonal.
	Links [][]string `json:"links"`
	// Islands are the NVLink islands, as GPU indices.
	Islands [][]int `json:"islands"`
	// Groups are the best-aligned groups keyed by group size.
	Groups map[string][][]int `json:"groups"`

	sizes []int // group sizes in ascending order, for the table
}

// gpuView is one GPU and the attributes its device would be published with.
type gpuView struct {
	Index int `json:"index"`
	// NUMANode is null when the topology does not tell.
	NUMANode    *int   `json:"numaNode"`
	CPUAffinity string `json:"cpuAffinity"`
	Island      int    `json:"island"`
	// Groups maps a group size to the ID of the aligned group this GPU is
	// in; sizes where it is left over are absent.
	Groups map[string]int `json:"groups"`
	// LinksAttr is the value of the links attribute.
	LinksAttr string `json:"linksAttr"`
}

func newTopologyView(t *topology.Topology) (*topologyView, error) {
	n := t.Len()
	v := &topologyView{
		GPUs:    make([]gpuView, n),
		Links:   make([][]string, n),
		Islands: positionsToIndices(t, t.Islands()),
		Groups:  map[string][][]int{},
		sizes:   topology.GroupSizes(n),
	}
	for _, k := range v.sizes {
		v.Groups[strconv.Itoa(k)] = positionsToIndices(t, t.AlignedGroups(k))
	}
	for p, g := range t.GPUs {
		row := make([]string, n)
		for q := range n {
			if p == q {
				row[q] = "X"
			} else {
				row[q] = t.Link(p, q).String()
			}
		}
		v.Links[p] = row
		links, err := topology.EncodeLinkRow(t, p)
		if err != nil {
			return nil, fmt.Errorf("GPU%d: %w", g.Index, err)
		}
		gv := gpuView{
			Index:       g.Index,
			CPUAffinity: g.CPUAffinity,
			Island:      t.IslandOf(p),
			Groups:      map[string]int{},
			LinksAttr:   links,
		}
		if g.NUMANode >= 0 {
			numa := g.NUMANode
			gv.NUMANode = &numa
		}
		for _, k := range v.sizes {
			if id, ok := t.GroupOf(k, p); ok {
				gv.Groups[strconv.Itoa(k)] = id
			}
		}
		v.GPUs[p] = gv
	}
	return v, nil
}

func positionsToIndices(t *topology.Topology, sets [][]int) [][]int {
	out := make([][]int, len(sets))
	for i, s := range sets {
		out[i] = indicesOf(t, s)
	}
	return out
}
