package tracebench

import (
	"fmt"

	"github.com/gpulink/gpulink/driver/topology"
)

// A replay through the real controller (test/scale TestReplayController,
// `make replay-controller`) creates the replay's nodes and tasks on a
// cluster: ReplayPlan is what it needs, built exactly as Replay builds its
// own run (the same nodes for the same stride, the same task sequence for
// the same seed and list, the same topologies, products and GPU memory),
// so that the cluster's outcome can be held against Replay's.

// PlanNode is a node of the plan: the trace's node and, when it has GPUs,
// the topology the replay maps it to (GPUs named after the trace's model,
// each with the replay's nominal memory, NominalGPUMemory).
type PlanNode struct {
	Node
	Topology *topology.Topology
}

// ReplayPlan is the nodes and the arriving tasks of one replay.
type ReplayPlan struct {
	Nodes []PlanNode
	// Tasks in arrival order (tasks drawn until their GPU requests reach
	// MaxPercent of CapacityMilli).
	Tasks         []Task
	CapacityMilli int64
}

// NominalGPUMemory is the memory every GPU of the replay is given: a share
// of m milli GPU asks for m thousandths of it (ShareMemory).
const NominalGPUMemory = MilliPerGPU * nominalShareUnit

// ShareMemory and ShareCores are what a share of milli GPU asks for in
// gpulink's terms, as the replay's gpulink policy asks.
func ShareMemory(milli int) int64 { return int64(milli) * nominalShareUnit }
func ShareCores(milli int) int64  { return int64(milli / shareGranularity) }

// NewReplayPlan returns the plan of Replay's run of seed on tr with opt's
// NodeStride, MaxPercent and TopologyDir.
func NewReplayPlan(tr *Trace, opt Options, seed uint64) (*ReplayPlan, error) {
	opt.defaults()
	var nodes []Node
	for i := 0; i < len(tr.Nodes); i += opt.NodeStride {
		nodes = append(nodes, tr.Nodes[i])
	}
	ks := newKindSet(opt.TopologyDir)
	c, err := newCluster(nodes, ks)
	if err != nil {
		return nil, err
	}
	if c.capMilli == 0 {
		return nil, fmt.Errorf("trace %s: the nodes have no GPUs", tr.List)
	}
	p := &ReplayPlan{CapacityMilli: c.capMilli}
	for i, n := range c.nodes {
		pn := PlanNode{Node: nodes[i]}
		if n.kind != nil {
			pn.Topology = n.kind.topo
		}
		p.Nodes = append(p.Nodes, pn)
	}
	for _, ti := range sequence(tr.Tasks, c.capMilli*int64(opt.MaxPercent)/100, seed, tr.List) {
		p.Tasks = append(p.Tasks, tr.Tasks[ti])
	}
	return p, nil
}
