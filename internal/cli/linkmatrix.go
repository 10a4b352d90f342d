package cli

// writeLinkMatrix prints a topology view's link matrix as nvidia-smi does,
// one row per GPU with its NUMA node and CPU affinity, and ends the
// tabwriter section. It is the LINKS section of `gpulink topology`
// (writeTopologyTable); TestLinkMatrixMatchesTopologyTable keeps the two
// identical.
func writeLinkMatrix(p *errWriter, v *topologyView) {
	p.printf("LINKS")
	for _, g := range v.GPUs {
		p.printf("\tGPU%d", g.Index)
	}
	p.printf("\tNUMA\tCPU AFFINITY\n")
	for i, g := range v.GPUs {
		p.printf("GPU%d", g.Index)
		for _, cell := range v.Links[i] {
			p.printf("\t%s", cell)
		}
		p.printf("\t%s\t%s\n", numaString(g.NUMANode), orDash(g.CPUAffinity))
	}
	p.flush()
}
