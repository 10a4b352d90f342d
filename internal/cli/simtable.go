package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// writeSimulationTable renders the outcomes for people, then the final
// state of every node.
func writeSimulationTable(w io.Writer, ls *loadedScenario, outcomes []StepOutcome) error {
	p := &errWriter{w: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	p.printf("STEP\tOP\tID\tNODE\tGPUS\tLINK\tSHARE\tFREE AFTER\tRESULT\n")
	for _, o := range outcomes {
		node, gpus, result := o.Node, formatIndices(o.GPUs), "ok"
		if o.Op == opFree && o.freedNode != "" {
			node, gpus, result = o.freedNode, formatIndices(o.freedGPUs), "released"
		}
		share := ""
		if o.Memory != "" {
			share = fmt.Sprintf("%s, %d%% cores", o.Memory, o.Cores)
		}
		free := ""
		if o.nodeTotal > 0 {
			free = fmt.Sprintf("%d/%d", o.nodeFree, o.nodeTotal)
		}
		if o.Error != "" {
			gpus, result = "-", "FAILED: "+o.Error
		}
		p.printf("%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			o.Step, o.Op, o.ID, orDash(node), gpus, orDash(o.Link), orDash(share), orDash(free), result)
	}
	p.flush()

	p.printf("\nNODE\tGPUS\tWHOLE FREE\tIN USE (whole)\tSHARED\n")
	for i, n := range ls.nodes {
		var whole []int
		var shared []string
		for pos, g := range n.Topology.GPUs {
			if n.Usage == nil {
				break
			}
			switch u := n.Usage[pos]; {
			case u.Exclusive:
				whole = append(whole, g.Index)
			case u.Shares > 0:
				shared = append(shared, fmt.Sprintf("GPU%d: %d share(s), %s, %d%% cores",
					g.Index, u.Shares, bytesString(u.MemoryBytes), u.Cores))
			}
		}
		p.printf("%s\t%d (%s)\t%d\t%s\t%s\n", n.Name, n.Topology.Len(), ls.files[i],
			n.FreeGPUs(), formatIndices(whole), orDash(strings.Join(shared, "; ")))
	}
	p.flush()
	return p.err
}
