package allocate

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

const gib = int64(1) << 30

// matrix builds a topology from rows of `nvidia-smi topo -m` link tokens
// ("X" on the diagonal), every GPU with memGiB of memory.
func matrix(tb testing.TB, memGiB int64, rows ...string) *topology.Topology {
	tb.Helper()
	n := len(rows)
	gpus := make([]topology.GPU, n)
	links := make([][]topology.Link, n)
	for i, row := range rows {
		gpus[i] = topology.GPU{Index: i, Minor: i, MemoryBytes: memGiB * gib, NUMANode: -1}
		cells := strings.Fields(row)
		if len(cells) != n {
			tb.Fatalf("row %d has %d cells, want %d", i, len(cells), n)
		}
		links[i] = make([]topology.Link, n)
		for j, c := range cells {
			if i == j {
				continue
			}
			l, err := topology.ParseLink(c)
			if err != nil {
				tb.Fatalf("row %d cell %d: %v", i, j, err)
			}
			links[i][j] = l
		}
	}
	t, err := topology.New(gpus, links)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// generated builds an n-GPU topology whose link between i and j is
// link(i, j), which must be symmetric.
func generated(tb testing.TB, n int, memGiB int64, link func(i, j int) string) *topology.Topology {
	tb.Helper()
	rows := make([]string, n)
	for i := range n {
		cells := make([]string, n)
		for j := range n {
			cells[j] = "X"
			if i != j {
				cells[j] = link(i, j)
			}
		}
		rows[i] = strings.Join(cells, " ")
	}
	return matrix(tb, memGiB, rows...)
}

// fixture loads a topology from the shared testdata of package topology
// (`nvidia-smi topo -m` output of real or realistic machines), giving
// every GPU memGiB of memory, which topology files do not record.
func fixture(tb testing.TB, file string, memGiB int64) *topology.Topology {
	tb.Helper()
	parsed, err := topology.ParseFile(filepath.Join("..", "topology", "testdata", file))
	if err != nil {
		tb.Fatal(err)
	}
	return withMemory(tb, parsed, memGiB*gib)
}

// withMemory copies t, giving every GPU mem bytes of memory.
func withMemory(tb testing.TB, t *topology.Topology, mem int64) *topology.Topology {
	tb.Helper()
	gpus := append([]topology.GPU(nil), t.GPUs...)
	links := make([][]topology.Link, t.Len())
	for i := range gpus {
		gpus[i].MemoryBytes = mem
		links[i] = make([]topology.Link, t.Len())
		for j := range gpus {
			links[i][j] = t.Link(i, j)
		}
	}
	out, err := topology.New(gpus, links)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// v100 is the Aliyun sccgn6 hybrid cube mesh: NV1/NV2 between the GPUs of
// {0,1,2,3} and of {4,5,6,7}, a few NV links across, SYS otherwise.
func v100(tb testing.TB) *topology.Topology {
	return fixture(tb, "v100-sxm2-8-aliyun-sccgn6.txt", 16)
}

// p40 is seven P40s on two PCIe switches: {0,1,2} and {3,4,5,6}, PHB across.
func p40(tb testing.TB) *topology.Topology { return fixture(tb, "p40-pcie-7.txt", 24) }

// nvbridge is eight PCIe GPUs with NV4 bridges on pairs 0-1, 2-3, 4-5,
// 6-7; PXB between the pairs of NUMA node 0, NODE between those of NUMA
// node 1, SYS across.
func nvbridge(tb testing.TB) *topology.Topology { return fixture(tb, "pcie-nvbridge-8.txt", 48) }

func dgxA100(tb testing.TB) *topology.Topology { return fixture(tb, "dgx-a100.txt", 80) } // NV12 all pairs
func dgxH100(tb testing.TB) *topology.Topology { return fixture(tb, "dgx-h100.txt", 80) } // NV18 all pairs
func dgx2(tb testing.TB) *topology.Topology    { return fixture(tb, "dgx2-16.txt", 32) }  // NV6 all pairs

// pcie16 is four PCIe switches of four GPUs (PIX), two switches per NUMA
// node (NODE), SYS across.
func pcie16(tb testing.TB) *topology.Topology { return fixture(tb, "pcie-16.txt", 32) }

// pcie4 is two PIX pairs on different NUMA nodes (SYS across).
func pcie4(tb testing.TB) *topology.Topology { return fixture(tb, "pcie-4.txt", 16) }

// synthetic32 is four V100 hybrid cube meshes (NV1/NV2, PXB where the mesh
// has no link), two per NUMA node (NODE), SYS across.
func synthetic32(tb testing.TB) *topology.Topology { return fixture(tb, "synthetic-32.txt", 32) }

// nvlinkTiered is 32 GPUs all joined by NVLink: NV18 within quads, NV12
// across, so one NVLink component holds more GPUs than the exact search.
func nvlinkTiered(tb testing.TB) *topology.Topology {
	return generated(tb, 32, 96, func(i, j int) string {
		if i/4 == j/4 {
			return "NV18"
		}
		return "NV12"
	})
}

// Fixtures written from the layouts of common machines (see the Source
// line at the end of each file).
func dgx1V100(tb testing.TB) *topology.Topology    { return fixture(tb, "dgx1-v100.txt", 32) }
func dgx1P100(tb testing.TB) *topology.Topology    { return fixture(tb, "dgx1-p100.txt", 16) }
func pcieSwitch8(tb testing.TB) *topology.Topology { return fixture(tb, "pcie-switch-8.txt", 48) }
func pciePEX8(tb testing.TB) *topology.Topology    { return fixture(tb, "pcie-pex-8.txt", 48) }
func workstation4(tb testing.TB) *topology.Topology {
	return fixture(tb, "workstation-4-nvbridge.txt", 24)
}
func plx10(tb testing.TB) *topology.Topology { return fixture(tb, "pcie-plx-10.txt", 24) }
func plx10Single(tb testing.TB) *topology.Topology {
	return fixture(tb, "pcie-plx-10-single-root.txt", 24)
}

type namedTopology struct {
	name string
	topo *topology.Topology
}

func allTopologies(tb testing.TB) []namedTopology {
	return []namedTopology{
		{"v100-sxm2-8", v100(tb)},
		{"p40-pcie-7", p40(tb)},
		{"dgx-a100", dgxA100(tb)},
		{"dgx-h100", dgxH100(tb)},
		{"pcie-nvbridge-8", nvbridge(tb)},
		{"dgx2-16", dgx2(tb)},
		{"pcie-16", pcie16(tb)},
		{"pcie-4", pcie4(tb)},
		{"synthetic-32", synthetic32(tb)},
		{"nvlink-tiered-32", nvlinkTiered(tb)},
		{"dgx1-v100", dgx1V100(tb)},
		{"dgx1-p100", dgx1P100(tb)},
		{"pcie-switch-8", pcieSwitch8(tb)},
		{"pcie-pex-8", pciePEX8(tb)},
		{"workstation-4-nvbridge", workstation4(tb)},
		{"pcie-plx-10", plx10(tb)},
		{"pcie-plx-10-single-root", plx10Single(tb)},
	}
}

// nodeWith builds a node with the GPUs at the given positions exclusive.
func nodeWith(name string, t *topology.Topology, used ...int) *NodeState {
	n := &NodeState{Name: name, Topology: t, Usage: make([]GPUUsage, t.Len())}
	for _, p := range used {
		n.Usage[p].Exclusive = true
	}
	return n
}
