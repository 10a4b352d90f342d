package gang

import "fmt"

// cluster is a test cluster of 8-GPU nodes; used[i] GPUs are taken on
// node i, and slots are counted for pods of gpusPerPod GPUs.
type cluster struct {
	name    string
	domains func(i int) []string
	nodes   int
}

// superPODCluster: DGX SuperPOD-style scalable units, 32 nodes per leaf,
// 8 leaves per spine, 4 spines per zone (no NVLink across nodes).
func superPODCluster(nodes int) cluster {
	return cluster{name: "superpod", nodes: nodes, domains: func(i int) []string {
		return []string{"", "", fmt.Sprintf("leaf-%d", i/32), fmt.Sprintf("spine-%d", i/256), fmt.Sprintf("zone-%d", i/1024)}
	}}
}

// nvl72Cluster: GB200 NVL72-style racks, 18 nodes per NVLink clique, 4
// cliques per leaf, 7 leaves per spine, 2 spines per zone.
func nvl72Cluster(nodes int) cluster {
	return cluster{name: "nvl72", nodes: nodes, domains: func(i int) []string {
		return []string{fmt.Sprintf("cluster-uuid.%d", i/18), "", fmt.Sprintf("leaf-%d", i/72), fmt.Sprintf("spine-%d", i/504), fmt.Sprintf("zone-%d", i/1008)}
	}}
}

func (c cluster) build(used map[int]int, gpusPerPod int) []Node {
	out := make([]Node, c.nodes)
	for i := range out {
		free := 8 - used[i]
		out[i] = Node{Name: fmt.Sprintf("n%04d", i), Domains: c.domains(i), Slots: free / max(gpusPerPod, 1), FreeGPUs: free, TotalGPUs: 8}
	}
	return out
}

// busy marks nodes [from, to) fully used.
func busy(used map[int]int, from, to int) map[int]int {
	for i := from; i < to; i++ {
		used[i] = 8
	}
	return used
}
