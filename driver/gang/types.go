package gang

// Constraint says whether a gang's level is a requirement or a preference,
// as minLink does for the GPUs of one node.
type Constraint string

const (
	// None (the zero Constraint): the gang is placed at the lowest level
	// it fits, whatever Request.Level says.
	None Constraint = ""
	// Preferred: the gang is placed at the lowest level it
	// fits; above Request.Level only when it fits nowhere lower, and the
	// Placement says so (Relaxed, Note).
	Preferred Constraint = "Preferred"
	// Required: the gang is placed within one domain of Request.Level or
	// lower, or not at all.
	Required Constraint = "Required"
)

// Request is one gang to place, all of its pods at once.
type Request struct {
	// Name is the gang's name in messages ("train-a").
	Name string
	// Pods is the number of pods to place.
	Pods int
	// MinCount is the fewest pods that may be placed (a PodGroup's
	// gang.minCount); 0 means Pods. Place places as many pods as fit, from
	// Pods down to MinCount, more pods first, then the lowest level.
	MinCount int
	// GPUsPerPod is the GPUs each pod asks for; it weighs the
	// fragmentation measures (Node.FreeGPUs) and appears in messages.
	GPUsPerPod int
	// Level is the level the gang should stay within (index into the
	// Hierarchy: 0 one node, Cluster() every node); with Constraint it
	// plays the role minLink plays inside a node. Every gang is placed at
	// the lowest level it fits; Level says when that is not good enough.
	Level int
	// Constraint: None (""), Preferred or Required.
	Constraint Constraint
	// Demand is the gang shapes asked for lately (the caller keeps the
	// history, DemandHistory.Shapes, as SizeHistory does for GPU sets;
	// the controller and the replay share it): among the domains of
	// the lowest level that holds the gang, Place takes the one that keeps
	// the most of it placeable on its own minimal level (doc.go,
	// criterion 3). Empty: best fit alone.
	Demand []Shape
	// AlignRails asks for one alignment (Node.AlignedSlots key, such as
	// the NIC rail indices the pods' claims get) on every node of the
	// gang: slots are then counted per alignment and the gang uses one.
	AlignRails bool
}

// Node is one candidate node, as the caller sees it for this gang.
type Node struct {
	Name string
	// Domains are the node's label values per level 1..Cluster()-1 (index
	// i is level i+1; Hierarchy.Domains computes them); "" where the node
	// lacks the label. Shorter than the hierarchy: the rest are "".
	Domains []string
	// Slots is how many pods of this gang the node can take now, computed
	// by the caller (the in-node allocator on the node's free GPUs, the
	// pods' other claims and host resources). 0: none.
	Slots int
	// FreeGPUs and TotalGPUs are the node's free and total GPUs: the
	// fragmentation measures keep domains with the most free GPUs whole.
	FreeGPUs  int
	TotalGPUs int
	// AlignedSlots, with Request.AlignRails, is Slots per alignment key
	// (for example "rail=0,1"): how many pods the node can take when each
	// uses that alignment. Ignored without AlignRails.
	AlignedSlots map[string]int
}

// Placement is a placed gang.
type Placement struct {
	Gang string
	// Nodes has one node name per placed pod (pods are interchangeable;
	// a node taking several pods appears several times, adjacently).
	Nodes []string
	// Level is the highest level the gang spans (its link class), and
	// LevelName its name.
	Level     int
	LevelName string
	// Domain is the label value of the domain spanned at Level: the node
	// name at level 0, "" for the cluster.
	Domain string
	// Alignment is the Node.AlignedSlots key used, with AlignRails.
	Alignment string
	// Relaxed is true when a Preferred Level could not be met and the gang
	// spans a higher level; Note then says why, in the style of
	// UnplaceableError ("gang train-a: 4 pods × 8 GPUs: only 3 fit in one
	// leaf; placed across 2 leaves of one spine").
	Relaxed bool
	Note    string
}

// PodsOn counts the pods the placement puts on each node.
func (p *Placement) PodsOn() map[string]int {
	m := make(map[string]int, len(p.Nodes))
	for _, n := range p.Nodes {
		m[n]++
	}
	return m
}
