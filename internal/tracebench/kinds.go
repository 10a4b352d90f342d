package tracebench

import (
	"fmt"
	"path/filepath"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// The trace carries no link topology, so each node model is given the
// layout of a machine of its kind, from the fixtures in
// driver/topology/testdata (real `nvidia-smi topo -m` output):
//
//   - V100M16 / V100M32, 8 GPUs: v100-sxm2-8-aliyun-sccgn6, Alibaba
//     Cloud's own V100 SXM2 server (the trace's operator), a DGX-1-style
//     hybrid cube mesh: NV1/NV2 inside each quad, sparse NVLink across
//     quads, SYS otherwise.
//   - V100M16 / V100M32, 4 GPUs: GPUs 0-3 of that mesh, one all-NVLink
//     quad (the 4-GPU SXM2 instances are half of such a board).
//   - T4, 4 GPUs: pcie-4, two PCIe switches with two GPUs each on two
//     sockets: T4 is a PCIe-only card, no NVLink.
//   - T4 / P100, 2 GPUs: GPUs 0-1 of pcie-4, a pair behind one switch
//     (PCIe P100 and T4 servers; a pair has one link whatever it is).
//   - G3, 8 GPUs (undisclosed; 128 cores, 768 GiB: the largest hosts of
//     the trace, the shape of an A100 HGX board): dgx-a100, NVSwitch.
//   - G2, 8 GPUs (undisclosed; 96 cores, 384 GiB): pcie-switch-8, two
//     GPUs per PCIe switch, two switches per socket. Nothing says it has
//     NVLink, so it gets the plainest 8-GPU server.
//   - any node of one GPU (V100M16, P100, A10): a single GPU, no link.
//
// Any other (model, GPUs) combination up to 8 GPUs gets the first GPUs of
// pcie-switch-8, up to 16 pcie-16, so a trace with other nodes still runs.
// The node's GPUs are the first n of the file (subTopology).
type kindSource struct {
	file string
}

func sourceFor(model string, gpus int) kindSource {
	switch {
	case gpus == 1:
		return kindSource{file: "pcie-4.txt"}
	case (model == "V100M16" || model == "V100M32") && gpus == 8:
		return kindSource{file: "v100-sxm2-8-aliyun-sccgn6.txt"}
	case (model == "V100M16" || model == "V100M32") && gpus <= 4:
		return kindSource{file: "v100-sxm2-8-aliyun-sccgn6.txt"}
	case model == "G3" && gpus == 8:
		return kindSource{file: "dgx-a100.txt"}
	case gpus <= 4:
		return kindSource{file: "pcie-4.txt"}
	case gpus <= 8:
		return kindSource{file: "pcie-switch-8.txt"}
	default:
		return kindSource{file: "pcie-16.txt"}
	}
}

// nominalShareUnit is the memory, in bytes, of one milli GPU: every GPU of
// the replay is given 1000 of them (16,000 MiB). The trace's shares are
// fractions of a GPU whatever its model, so every GPU gets the same
// nominal memory and a share of m milli asks for m units: the same
// fraction on every node, exactly.
const nominalShareUnit = 16 << 20

// kind is one node model with its GPU count and the topology it is mapped to.
type kind struct {
	model string
	gpus  int
	file  string
	topo  *topology.Topology
	// ideal[k] is the weakest link of the best k-GPU set of the idle
	// node: the class a k-GPU task placed here counts as ideal at.
	ideal []topology.Link
}

// kindSet builds and caches kinds from a directory of topology files.
type kindSet struct {
	dir   string
	files map[string]*topology.Topology
	kinds map[[2]string]*kind
}

func newKindSet(dir string) *kindSet {
	return &kindSet{dir: dir, files: map[string]*topology.Topology{}, kinds: map[[2]string]*kind{}}
}

func (ks *kindSet) get(model string, gpus int) (*kind, error) {
	key := [2]string{model, fmt.Sprint(gpus)}
	if k, ok := ks.kinds[key]; ok {
		return k, nil
	}
	src := sourceFor(model, gpus)
	full, ok := ks.files[src.file]
	if !ok {
		t, err := topology.ParseFile(filepath.Join(ks.dir, src.file))
		if err != nil {
			return nil, fmt.Errorf("topology for %s with %d GPUs: %w", model, gpus, err)
		}
		ks.files[src.file], full = t, t
	}
	if gpus > full.Len() {
		return nil, fmt.Errorf("topology for %s with %d GPUs: %s has only %d GPUs", model, gpus, src.file, full.Len())
	}
	t, err := subTopology(full, gpus, model)
	if err != nil {
		return nil, fmt.Errorf("topology for %s with %d GPUs from %s: %w", model, gpus, src.file, err)
	}
	k := &kind{model: model, gpus: gpus, file: src.file, topo: t, ideal: make([]topology.Link, gpus+1)}
	for size := 2; size <= gpus; size++ {
		r, err := allocate.Allocate(&allocate.NodeState{Name: "idle", Topology: t}, allocate.Request{GPUs: size}, allocate.Policy{})
		if err != nil {
			return nil, fmt.Errorf("ideal %d-GPU set of %s: %w", size, src.file, err)
		}
		k.ideal[size] = r.WeakestLink
	}
	ks.kinds[key] = k
	return k, nil
}

// subTopology keeps the first n GPUs of t, each with the nominal memory
// (shares need a known memory size in the allocator) and the trace's
// model as its product name (what a gpu_spec names, as a claim's selector
// names productName).
func subTopology(t *topology.Topology, n int, model string) (*topology.Topology, error) {
	gpus := make([]topology.GPU, n)
	links := make([][]topology.Link, n)
	for i := range n {
		gpus[i] = t.GPUs[i]
		gpus[i].MemoryBytes = MilliPerGPU * nominalShareUnit
		gpus[i].ProductName = model
		links[i] = make([]topology.Link, n)
		for j := range n {
			links[i][j] = t.Link(i, j)
		}
	}
	return topology.New(gpus, links)
}
