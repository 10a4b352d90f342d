package gangbench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
)

// GPUsPerNode is every simulated node's GPU count.
const GPUsPerNode = 8

// Cluster is a simulated cluster: nodes with their domains in the default
// hierarchy (driver/gang's DefaultKeys), indexed for the baselines.
type Cluster struct {
	Name  string
	Shape string // one line for the report
	H     *gang.Hierarchy
	// Nodes are the nodes' names and domains (Slots and FreeGPUs are
	// filled in per decision).
	Nodes []gang.Node
	// Levels are the label levels some node carries, tightest first.
	Levels []int
	// domains[lv][d] are the nodes of domain d of level lv (label levels
	// only); domainOf[lv][i] is node i's domain there, -1 without one.
	domains  [][][]int
	domainOf [][]int
	// largest[lv] is the node count of level lv's largest domain.
	largest []int
	// tieRank[i] is node i's place in the order of the controller's tie
	// keys (allocate.TopologyTieKey: domains widest first, then name).
	tieRank []int
}

// SuperPOD is a DGX SuperPOD-style cluster: scalable units of 32 nodes per
// leaf, 8 leaves per spine, 4 spines per zone (no NVLink across nodes).
func SuperPOD(nodes int) *Cluster {
	c := newCluster("superpod", nodes, func(i int) []string {
		return []string{"", "", fmt.Sprintf("leaf-%03d", i/32), fmt.Sprintf("spine-%02d", i/256), fmt.Sprintf("zone-%d", i/1024)}
	})
	c.Shape = fmt.Sprintf("%d 8-GPU nodes, 32 per leaf, 256 per spine, 1,024 per zone", nodes)
	return c
}

// NVL72 is a GB200 NVL72-style cluster: NVLink cliques of 18 nodes (the
// rack), 4 cliques per leaf, 7 leaves per spine, 2 spines per zone. Nodes
// keep 8 GPUs (the trace's pods ask for 8), so it models the cliques'
// grouping, not the trays' 4 GPUs.
func NVL72(nodes int) *Cluster {
	c := newCluster("nvl72", nodes, func(i int) []string {
		return []string{fmt.Sprintf("clique-%03d", i/18), "", fmt.Sprintf("leaf-%02d", i/72), fmt.Sprintf("spine-%d", i/504), fmt.Sprintf("zone-%d", i/1008)}
	})
	c.Shape = fmt.Sprintf("%d 8-GPU nodes, 18 per NVLink clique, 72 per leaf, 504 per spine, 1,008 per zone", nodes)
	return c
}

func newCluster(name string, n int, domains func(i int) []string) *Cluster {
	h := gang.DefaultHierarchy()
	c := &Cluster{Name: name, H: h, Nodes: make([]gang.Node, n)}
	for i := range c.Nodes {
		c.Nodes[i] = gang.Node{Name: fmt.Sprintf("%s-%04d", name, i), Domains: domains(i), TotalGPUs: GPUsPerNode}
	}
	top := h.Cluster()
	c.domains = make([][][]int, top)
	c.domainOf = make([][]int, top)
	c.largest = make([]int, top+1)
	c.largest[0] = 1
	c.largest[top] = n
	for lv := 1; lv < top; lv++ {
		idx := map[string]int{}
		c.domainOf[lv] = make([]int, n)
		for i := range c.Nodes {
			v := c.Nodes[i].Domains[lv-1]
			if v == "" {
				c.domainOf[lv][i] = -1
				continue
			}
			d, ok := idx[v]
			if !ok {
				d = len(c.domains[lv])
				idx[v] = d
				c.domains[lv] = append(c.domains[lv], nil)
			}
			c.domainOf[lv][i] = d
			c.domains[lv][d] = append(c.domains[lv][d], i)
			c.largest[lv] = max(c.largest[lv], len(c.domains[lv][d]))
		}
		if len(c.domains[lv]) > 0 {
			c.Levels = append(c.Levels, lv)
		}
	}
	c.rankTieKeys()
	return c
}

// rankTieKeys sets tieRank from the nodes' domains and names, as the
// controller orders nodes that score alike (controller/tiekey.go).
func (c *Cluster) rankTieKeys() {
	keys := make([]string, len(c.Nodes))
	order := make([]int, len(c.Nodes))
	for i, n := range c.Nodes {
		keys[i] = allocate.TopologyTieKey(n.Domains, n.Name)
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	c.tieRank = make([]int, len(c.Nodes))
	for r, i := range order {
		c.tieRank[i] = r
	}
}

// GPUs is the cluster's GPU count.
func (c *Cluster) GPUs() int { return len(c.Nodes) * GPUsPerNode }

// Span is the highest level the nodes span: 0 for one node, else the
// lowest label level they all share a domain of, else the cluster.
func (c *Cluster) Span(nodes []int) int {
	one := true
	for _, i := range nodes {
		if i != nodes[0] {
			one = false
			break
		}
	}
	if one {
		return 0
	}
	for _, lv := range c.Levels {
		d := c.domainOf[lv][nodes[0]]
		same := d >= 0
		for _, i := range nodes {
			if c.domainOf[lv][i] != d {
				same = false
				break
			}
		}
		if same {
			return lv
		}
	}
	return c.H.Cluster()
}

// MinLevel is the lowest level a job of pods × gpusPerPod can span on the
// idle cluster: its link class at best.
func (c *Cluster) MinLevel(pods, gpusPerPod int) int {
	per := GPUsPerNode / gpusPerPod
	if pods <= per {
		return 0
	}
	for _, lv := range c.Levels {
		if c.largest[lv]*per >= pods {
			return lv
		}
	}
	return c.H.Cluster()
}

// sameDomain is the nodes sharing node i's domain of level lv (i alone at
// level 0 or without the label).
func (c *Cluster) sameDomain(i, lv int) []int {
	if lv == 0 || lv >= c.H.Cluster() {
		return []int{i}
	}
	d := c.domainOf[lv][i]
	if d < 0 {
		return []int{i}
	}
	return c.domains[lv][d]
}
