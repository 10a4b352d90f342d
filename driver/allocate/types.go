package allocate

import (
	"github.com/gpulink/gpulink/driver/topology"
)

// Strategy says whether to pack work tightly or spread it out.
type Strategy string

const (
	// Binpack fills the busiest GPU (or node) that still fits, keeping
	// whole GPUs and whole nodes free for large jobs.
	Binpack Strategy = "binpack"
	// Spread places work on the least-used GPU (or node).
	Spread Strategy = "spread"
)

// Policy chooses the packing strategy at node level and at GPU level (for shares).
type Policy struct {
	Node Strategy `json:"node,omitempty"`
	GPU  Strategy `json:"gpu,omitempty"`
	// Mix is how often each request size is asked for; the fragmentation
	// tie-break keeps free what is asked for most (doc.go, criterion 2).
	// nil means DefaultSizeMix. A pointer keeps Policy comparable.
	Mix *SizeMix `json:"-"`
	// Demand, when set, is the mix of recent GPU pods (with their CPU
	// and memory) that node choice keeps room for: nodes are ranked
	// first by the GPU a placement strands for them (DemandMix; doc.go,
	// "Choosing a node"). nil ranks as before, on GPUs alone.
	Demand *DemandMix `json:"-"`
}

// GPUUsage is what is already consumed on one GPU.
type GPUUsage struct {
	// Exclusive is true when the GPU is given out whole.
	Exclusive bool
	// Shares is the number of shares placed on the GPU.
	Shares int
	// MemoryBytes and Cores are the sums consumed by those shares
	// (cores: 100 = the whole GPU).
	MemoryBytes int64
	Cores       int64
	// Group is the sharing group of the GPU's shares while it holds any
	// (ShareRequest.Group); MixedShareGroups when they belong to several,
	// which no share may join.
	Group string
}

// MixedShareGroups is GPUUsage.Group for a GPU whose shares belong to
// several sharing groups: only allocations made elsewhere produce it, and
// no further share may join it.
const MixedShareGroups = "\x00mixed"

// NodeState is one node as the allocator sees it.
type NodeState struct {
	Name string
	// TieKey orders nodes of equal score in ChooseNode; empty: Name. The
	// controller sets the node's place in the cluster's topology
	// hierarchy before its name (TopologyTieKey), so that ties fill one
	// domain before the next whatever the nodes are named.
	TieKey   string
	Topology *topology.Topology
	// Usage is indexed by position in Topology; nil means nothing used.
	Usage []GPUUsage
	// MaxSharesPerGPU caps shares on one GPU; 0 means the package default.
	MaxSharesPerGPU int
	// MemoryOvercommitPercent lets the shares of one GPU add up to this
	// percentage of its memory (100..MaxMemoryOvercommitPercent); 0 means
	// 100, no over-commit. Like MaxSharesPerGPU it is the setting of the
	// request being placed, so a share whose class does not opt in never
	// joins a GPU whose shares would then exceed its memory.
	MemoryOvercommitPercent int
	// Host is the CPU and memory the node has left for pods, when known:
	// a node short of the request's Host is skipped, and with
	// Policy.Demand the GPU stranded behind exhausted CPU or memory
	// counts. nil: not known (GPUs alone decide).
	Host *Host
}

// MaxMemoryOvercommitPercent bounds NodeState.MemoryOvercommitPercent.
const MaxMemoryOvercommitPercent = 400

// ShareRequest asks for part of one GPU.
type ShareRequest struct {
	MemoryBytes int64
	// Cores is the percentage of the GPU's compute (1..100).
	Cores int64
	// Group is the share's sharing group: shares of different groups
	// never share a GPU. The empty group is every share that names none;
	// concurrent MPS shares are grouped by the one MPS server of their
	// namespace (clients of one server run side by side, and limits a
	// client sets for itself must not reach shares of other users).
	Group string
}

// Request is one allocation request: N whole GPUs, or one share.
type Request struct {
	// GPUs is the number of whole GPUs; must be 0 when Share is set.
	GPUs  int
	Share *ShareRequest
	// RequiredLink is the minimum link class every pair of the set must
	// have (topology.LinkNVLink for "every pair NVLink"). LinkNone means
	// best effort.
	RequiredLink topology.Link
	// Eligible restricts the GPUs (by position) that may be chosen, e.g.
	// after CEL selectors; nil means all.
	Eligible []bool
	// EligibleByNode is Eligible per node name, for ChooseNode over nodes
	// that differ (selectors evaluated per node). A node missing from the
	// map has no eligible GPU. At most one of Eligible and EligibleByNode
	// may be set; Allocate and Commit honor either.
	EligibleByNode map[string][]bool
	// Host is the CPU and memory the pod asks for besides its GPUs; it is
	// checked and counted only on nodes whose Host is known.
	Host Host
}

// Result is a successful placement.
type Result struct {
	Node string
	// GPUs are positions in the node's topology, ascending.
	GPUs []int
	// WeakestLink is the slowest link within the set; LinkNone for one GPU.
	WeakestLink topology.Link
	// AggregateLink is the sum of the link classes of every pair in the
	// set (0 for one GPU): ranked after WeakestLink and the future (doc.go).
	AggregateLink int
}

// DefaultMaxSharesPerGPU caps the shares placed on one GPU when
// NodeState.MaxSharesPerGPU is 0. 16 is the client limit of MPS on
// pre-Volta GPUs, the lowest any supported GPU has, and keeps each share's
// slice of memory and SMs large enough to be useful.
const DefaultMaxSharesPerGPU = 16
