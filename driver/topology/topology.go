package topology

import (
	"fmt"
	"sync"

	"github.com/gpulink/gpulink/driver/mig"
)

// GPU is what gpulink knows about one physical GPU. Fields that a source
// cannot tell (a topology file has no UUIDs, NVML has no CPU affinity text)
// stay at their zero value; NUMANode is -1 when unknown.
type GPU struct {
	// Index is the GPU's index as nvidia-smi and NVML number it.
	Index int `json:"index"`
	// Minor is the device node minor number (/dev/nvidia<Minor>).
	Minor int    `json:"minor"`
	UUID  string `json:"uuid,omitempty"`
	// ProductName is NVML's name, e.g. "NVIDIA A100-SXM4-40GB".
	ProductName string `json:"productName,omitempty"`
	// Architecture is the lower-case architecture name, e.g. "ampere".
	Architecture string `json:"architecture,omitempty"`
	// CUDAComputeCapability is "major.minor", e.g. "8.0".
	CUDAComputeCapability string `json:"cudaComputeCapability,omitempty"`
	DriverVersion         string `json:"driverVersion,omitempty"`
	MemoryBytes           int64  `json:"memoryBytes,omitempty"`
	// PCIBusID is the canonical domain:bus:device.function, e.g. "0000:07:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	// PCIeRoot is the root complex the GPU hangs off, e.g. "pci0000:00".
	PCIeRoot    string `json:"pcieRoot,omitempty"`
	NUMANode    int    `json:"numaNode"`
	CPUAffinity string `json:"cpuAffinity,omitempty"`
	// Clique is the GPU's multi-node NVLink clique (GB200/GB300 NVL72
	// racks), "<cluster UUID>.<clique ID>" as NVML's fabric info gives it
	// once the fabric manager has registered the GPU; empty for GPUs
	// without an NVLink fabric or not registered (yet). GPUs of one
	// clique on different nodes reach each other over NVLink.
	Clique string `json:"clique,omitempty"`
	// MIG is the GPU's MIG state; nil when the GPU (or the source) knows
	// no MIG. A GPU with MIG.Enabled is given out as its MIG devices
	// only, never whole or in shares.
	MIG *mig.GPU `json:"mig,omitempty"`
}

// MIGEnabled reports whether the GPU is in MIG mode.
func (g GPU) MIGEnabled() bool { return g.MIG != nil && g.MIG.Enabled }

// MaxGPUs bounds the node size the model accepts; sets are uint64 bitmasks.
const MaxGPUs = 64

// Topology is one node's GPUs in position order and the symmetric matrix of
// links between them. Positions (0..Len()-1) are what the allocator works
// with; GPUs[p].Index is what users see. They are equal on healthy nodes but
// may differ when a GPU is missing.
type Topology struct {
	GPUs  []GPU
	links []Link // row-major Len()×Len(); diagonal is LinkNone

	// Derived data. The link matrix never changes after New (GPUs' fields
	// may; nothing here depends on them), so islands are computed once
	// there and aligned groups on first use; derived is a pointer so that
	// copying a Topology value does not copy a mutex.
	islands  [][]int
	islandOf []int
	derived  *derivedCache
}

// derivedCache memoizes AlignedGroups per group size for concurrent readers.
type derivedCache struct {
	mu     sync.Mutex
	groups map[int]*alignedPartition
}

// New builds a topology from GPUs in position order and a full square link
// matrix indexed by position. The matrix must be symmetric with every
// off-diagonal cell set; the diagonal is ignored.
func New(gpus []GPU, links [][]Link) (*Topology, error) {
	n := len(gpus)
	if n > MaxGPUs {
		return nil, fmt.Errorf("%d GPUs on one node: at most %d are supported", n, MaxGPUs)
	}
	if len(links) != n {
		return nil, fmt.Errorf("link matrix has %d rows for %d GPUs", len(links), n)
	}
	seen := make(map[int]bool, n)
	for p, g := range gpus {
		if g.Index < 0 {
			return nil, fmt.Errorf("GPU at position %d has negative index %d", p, g.Index)
		}
		if seen[g.Index] {
			return nil, fmt.Errorf("duplicate GPU index %d", g.Index)
		}
		seen[g.Index] = true
	}
	t := &Topology{GPUs: append([]GPU(nil), gpus...), links: make([]Link, n*n)}
	for i := range n {
		if len(links[i]) != n {
			return nil, fmt.Errorf("link matrix row %d (GPU%d) has %d cells, want %d", i, gpus[i].Index, len(links[i]), n)
		}
		for j := range n {
			if i == j {
				continue
			}
			l := links[i][j]
			if l == LinkNone {
				return nil, fmt.Errorf("no link between GPU%d and GPU%d", gpus[i].Index, gpus[j].Index)
			}
			if !l.Valid() {
				return nil, fmt.Errorf("link between GPU%d and GPU%d has invalid class value %d", gpus[i].Index, gpus[j].Index, uint8(l))
			}
			if links[j][i] != l {
				return nil, fmt.Errorf("asymmetric link matrix: GPU%d->GPU%d is %s but GPU%d->GPU%d is %s",
					gpus[i].Index, gpus[j].Index, l, gpus[j].Index, gpus[i].Index, links[j][i])
			}
			t.links[i*n+j] = l
		}
	}
	t.islands, t.islandOf = nvlinkIslands(t)
	t.derived = &derivedCache{groups: make(map[int]*alignedPartition)}
	return t, nil
}

// Len is the number of GPUs.
func (t *Topology) Len() int { return len(t.GPUs) }

// Link returns the link between the GPUs at positions i and j (LinkNone for i == j).
func (t *Topology) Link(i, j int) Link { return t.links[i*len(t.GPUs)+j] }

// Position returns the position of the GPU with the given nvidia-smi index.
func (t *Topology) Position(index int) (int, bool) {
	for p, g := range t.GPUs {
		if g.Index == index {
			return p, true
		}
	}
	return -1, false
}
