package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/controller/report"
)

// inspectDocument is `inspect --output json`: one document, so that
// `jq .nodes[]` works and an empty cluster is {"nodes": []}.
type inspectDocument struct {
	Nodes []inspectNodeView `json:"nodes"`
	// Gangs are each gang's pods, placement and level (not in --watch).
	Gangs []report.Gang `json:"gangs,omitempty"`
}

// inspectNodeView is a node report plus its link matrix in GPU order ("X"
// on the diagonal), as `gpulink topology` shows it.
type inspectNodeView struct {
	report.Node
	Links [][]string `json:"links,omitempty"`

	view *topologyView // nil when the node has no decoded topology
}

func newInspectViews(reports []report.Node) ([]inspectNodeView, error) {
	out := make([]inspectNodeView, 0, len(reports))
	for _, r := range reports {
		nv := inspectNodeView{Node: r}
		if r.Topology != nil && r.Topology.Len() > 0 {
			v, err := newTopologyView(r.Topology)
			if err != nil {
				return nil, fmt.Errorf("node %s: %w", r.Name, err)
			}
			nv.view, nv.Links = v, v.Links
		}
		out = append(out, nv)
	}
	return out, nil
}

// writeInspectTable renders each node: a summary line, one row per GPU
// (continuation rows for further holders), notes on taints, problems and
// unknown devices, then the link matrix.
func writeInspectTable(w io.Writer, nodes []inspectNodeView, gs []report.Gang) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := &errWriter{w: tw}
	for i, n := range nodes {
		if i > 0 {
			p.printf("\n")
		}
		p.printf("%s\n", nodeSummary(n.Node))
		if n.Problem != "" {
			p.printf("  problem: %s\n", n.Problem)
		}
		if len(n.GPUs) > 0 {
			p.printf("\n")
			writeGPURows(p, n.GPUs)
		}
		if len(n.MIG) > 0 {
			p.printf("\n")
			writeMIGRows(p, n.MIG)
		}
		if len(n.OnDemand) > 0 {
			p.printf("\n")
			writeOnDemandRows(p, n.OnDemand)
		}
		writeNotes(p, n.Node)
		p.flush()
		if n.view != nil {
			p.printf("\n")
			writeLinkMatrix(p, n.view)
		}
	}
	writeGangRows(p, gs)
	p.flush()
	return p.err
}

func nodeSummary(r report.Node) string {
	var b strings.Builder
	b.WriteString("NODE " + r.Name)
	if r.Pool != r.Name {
		b.WriteString(" (pool " + r.Pool + ")")
	}
	switch {
	case r.Problem != "":
		b.WriteString(": unusable, the controller allocates nothing here")
	case len(r.GPUs) == 0 && len(r.MIG) == 0 && len(r.OnDemand) == 0:
		b.WriteString(": no GPUs (the kubelet plugin publishes an empty pool)")
	default:
		var free, shared, whole, tainted int
		for _, g := range r.GPUs {
			switch {
			case len(g.Whole) > 0:
				whole++
			case len(g.Shares) > 0:
				shared++
			case g.Tainted:
				tainted++
			default:
				free++
			}
		}
		fmt.Fprintf(&b, ": %d GPUs, %d free, %d shared, %d held whole", len(r.GPUs), free, shared, whole)
		if tainted > 0 {
			fmt.Fprintf(&b, ", %d tainted", tainted)
		}
		if len(r.MIG) > 0 {
			parents := map[int]bool{}
			freeMIG := 0
			for _, m := range r.MIG {
				parents[m.Parent] = true
				if m.Free {
					freeMIG++
				}
			}
			fmt.Fprintf(&b, "; %d GPUs in MIG mode, %d MIG devices, %d free", len(parents), len(r.MIG), freeMIG)
		}
		if len(r.OnDemand) > 0 {
			held := 0
			for _, g := range r.OnDemand {
				held += len(g.Partitions)
			}
			fmt.Fprintf(&b, "; %d GPUs partitioned on demand, %d partitions held", len(r.OnDemand), held)
		}
	}
	return b.String()
}

// writeGPURows prints the GPU table. FREE comes before the holder columns
// so a GPU's further holders continue on rows of their own.
func writeGPURows(p *errWriter, gpus []report.GPU) {
	p.printf("GPU\tPRODUCT\tMEMORY\tFREE\tHELD\tCLAIM\tSHARE\tRESERVED FOR\n")
	for _, g := range gpus {
		p.printf("%s\t%s\t%s\t%s", g.Device, orDash(printable(g.Product)), bytesString(g.MemoryBytes), freeString(g))
		var holders []string
		for _, c := range g.Whole {
			holders = append(holders, fmt.Sprintf("whole\t%s\t-\t%s", c, reservedString(c)))
		}
		for _, s := range g.Shares {
			holders = append(holders, fmt.Sprintf("share\t%s\t%s\t%s", s.Claim, shareString(s.MemoryBytes, s.Cores), reservedString(s.Claim)))
		}
		if len(holders) == 0 {
			holders = []string{"-\t-\t-\t-"}
		}
		for i, h := range holders {
			if i > 0 {
				p.printf("\t\t\t") // below the GPU's own four cells
			}
			p.printf("\t%s\n", h)
		}
	}
}

// writeMIGRows prints the MIG devices, by parent GPU and placement: the
// GPUs' MIG layout (SLICES are the memory slices the GPU instance takes)
// and who holds each device.
func writeMIGRows(p *errWriter, devs []report.MIG) {
	p.printf("MIG DEVICE\tGPU\tPROFILE\tSLICES\tMEMORY\tFREE\tCLAIM\tRESERVED FOR\n")
	for _, m := range devs {
		free := "no"
		switch {
		case m.Tainted:
			free = "no (tainted)"
		case m.Free:
			free = "yes"
		}
		span := strconv.Itoa(m.PlacementStart)
		if m.PlacementSize > 1 {
			span += "-" + strconv.Itoa(m.PlacementStart+m.PlacementSize-1)
		}
		p.printf("%s\tgpu-%d\t%s\t%s\t%s\t%s", m.Device, m.Parent, orDash(printable(m.Profile)), span, bytesString(m.MemoryBytes), free)
		holders := m.Holders
		if len(holders) == 0 {
			p.printf("\t-\t-\n")
			continue
		}
		for i, h := range holders {
			if i > 0 {
				p.printf("\t\t\t\t\t") // below the device's own six cells
			}
			p.printf("\t%s\t%s\n", h, reservedString(h))
		}
	}
}

// writeOnDemandRows prints the layout of the GPUs partitioned on demand:
// per GPU its free memory slices and the largest instances that still
// fit, then its held partitions by placement.
func writeOnDemandRows(p *errWriter, gpus []report.OnDemandGPU) {
	p.printf("ON-DEMAND GPU\tFREE SLICES\tSTILL POSSIBLE\n")
	for _, g := range gpus {
		p.printf("gpu-%d\t%s of %d\t%s\n", g.Index, report.SliceRanges(g.FreeSlices), g.MemorySlices, g.Possible)
	}
	var held []report.MIG
	for _, g := range gpus {
		held = append(held, g.Partitions...)
	}
	if len(held) > 0 {
		p.printf("\n")
		writeMIGRows(p, held)
	}
}

// writeNotes lists what the GPU rows cannot hold: taints, accounting
// problems, and allocations of devices the node does not publish.
func writeNotes(p *errWriter, r report.Node) {
	var notes []string
	for _, g := range r.GPUs {
		for _, t := range g.Taints {
			notes = append(notes, fmt.Sprintf("%s: tainted %s", g.Device, t))
		}
		for _, pr := range g.Problems {
			notes = append(notes, fmt.Sprintf("%s: problem: %s", g.Device, pr))
		}
	}
	for _, m := range r.MIG {
		for _, t := range m.Taints {
			notes = append(notes, fmt.Sprintf("%s: tainted %s", m.Device, t))
		}
		for _, pr := range m.Problems {
			notes = append(notes, fmt.Sprintf("%s: problem: %s", m.Device, pr))
		}
	}
	for _, g := range r.OnDemand {
		for _, pr := range g.Problems {
			notes = append(notes, fmt.Sprintf("gpu-%d: problem: %s", g.Index, pr))
		}
		for _, m := range g.Partitions {
			for _, pr := range m.Problems {
				notes = append(notes, fmt.Sprintf("%s: problem: %s", m.Device, pr))
			}
		}
	}
	for _, h := range r.UnknownDevices {
		how := "whole"
		if h.Share {
			how = "share " + shareString(h.MemoryBytes, h.Cores)
		}
		note := fmt.Sprintf("%s: not published by the node, yet held (%s) by %s", h.Device, how, h.Claim)
		if len(h.Claim.ReservedFor) > 0 {
			note += ", reserved for " + reservedString(h.Claim)
		}
		notes = append(notes, note)
	}
	if len(notes) == 0 {
		return
	}
	p.printf("\n")
	for _, n := range notes {
		p.printf("  %s\n", n)
	}
}

func freeString(g report.GPU) string {
	switch {
	case g.Tainted:
		return "none (tainted)"
	case g.Free:
		return "whole GPU"
	case len(g.Whole) > 0 || (g.FreeMemoryBytes == 0 && g.FreeCores == 0):
		return "none"
	}
	return shareString(g.FreeMemoryBytes, g.FreeCores)
}

// shareString shows memory in the binary units share requests use and
// cores as the capacity's percentage points.
func shareString(mem, cores int64) string {
	return fmt.Sprintf("%s, %d cores", bytesString(mem), cores)
}

// printable quotes a value a node published when it holds control
// characters, which would break the table or the terminal.
func printable(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

func bytesString(b int64) string {
	return resource.NewQuantity(b, resource.BinarySI).String()
}

func reservedString(c report.ClaimRef) string {
	if len(c.ReservedFor) == 0 {
		return "-"
	}
	return strings.Join(c.ReservedFor, ",")
}
