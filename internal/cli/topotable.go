package cli

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// writeTopologyTable renders the view for people: the matrix as nvidia-smi
// prints it, then islands, aligned groups and per-device attributes.
func writeTopologyTable(w io.Writer, source string, t *topology.Topology, v *topologyView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := &errWriter{w: tw}
	p.printf("%s: %d GPUs\n\n", source, t.Len())

	writeLinkMatrix(p, v)

	p.printf("\nNVLINK ISLANDS\n")
	if len(v.GPUs) > 1 && len(v.Islands) == len(v.GPUs) {
		// n islands of one GPU each would only repeat the GPU list.
		p.printf("none: no two GPUs share NVLink, each GPU is an island of its own\n")
	} else {
		for id, isl := range v.Islands {
			p.printf("island %d\tGPUs %s\t%s\n", id, formatIndices(isl), describeSet(t, isl))
		}
	}
	p.flush()

	p.printf("\nALIGNED GROUPS\n")
	if len(v.sizes) == 0 {
		p.printf("none: groups are published for sizes 2, 4, 8, ... smaller than the node\n")
	}
	for _, k := range v.sizes {
		size := strconv.Itoa(k)
		for id, g := range v.Groups[size] {
			p.printf("%s=%d\tGPUs %s\t%s\n", driver.GroupAttr(k), id, formatIndices(g), describeSet(t, g))
		}
		var left []int
		for _, g := range v.GPUs {
			if _, grouped := g.Groups[size]; !grouped {
				left = append(left, g.Index)
			}
		}
		if len(left) > 0 {
			p.printf("%s (none)\tGPUs %s\tleft over\n", driver.GroupAttr(k), formatIndices(left))
		}
	}
	p.flush()

	p.printf("\nDEVICE ATTRIBUTES (domain %s)\n", driver.Name)
	p.printf("DEVICE\t%s\t%s\t%s", driver.AttrIndex, driver.AttrNUMANode, driver.AttrNVLinkIsland)
	for _, k := range v.sizes {
		p.printf("\t%s", driver.GroupAttr(k))
	}
	p.printf("\t%s\n", driver.AttrLinks)
	for _, g := range v.GPUs {
		p.printf("%s\t%d\t%s\t%d", driver.DeviceName(g.Index), g.Index, numaString(g.NUMANode), g.Island)
		for _, k := range v.sizes {
			if id, ok := g.Groups[strconv.Itoa(k)]; ok {
				p.printf("\t%d", id)
			} else {
				p.printf("\t-")
			}
		}
		p.printf("\t%s\n", g.LinksAttr)
	}
	p.flush()
	return p.err
}

// describeSet summarizes the links within a set of GPU indices.
func describeSet(t *topology.Topology, indices []int) string {
	if len(indices) < 2 {
		return "single GPU"
	}
	pos := make([]int, 0, len(indices))
	for _, idx := range indices {
		if p, ok := t.Position(idx); ok {
			pos = append(pos, p)
		}
	}
	return fmt.Sprintf("weakest %s, link sum %d", t.WeakestLink(pos), t.LinkSum(pos))
}

func numaString(n *int) string {
	if n == nil {
		return "-"
	}
	return strconv.Itoa(*n)
}

// errWriter keeps the first write error so rendering code stays linear.
type errWriter struct {
	w   *tabwriter.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// flush ends a tabwriter section so each section aligns on its own.
func (e *errWriter) flush() {
	if e.err == nil {
		e.err = e.w.Flush()
	}
}
