package gpucheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// hostFixture is what nvidia-smi printed on one host.
type hostFixture struct {
	query []SMIGPU
	topo  *topology.Topology
	// queryText and topoText are the raw outputs.
	queryText, topoText string
}

func loadHost(t *testing.T, name string) hostFixture {
	t.Helper()
	q, err := os.ReadFile(filepath.Join("testdata", name+".query.csv"))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := os.ReadFile(filepath.Join("testdata", name+".topo.txt"))
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := ParseQueryGPU(strings.NewReader(string(q)))
	if err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Parse(strings.NewReader(string(tp)))
	if err != nil {
		t.Fatal(err)
	}
	return hostFixture{query: gpus, topo: topo, queryText: string(q), topoText: string(tp)}
}

// discovered is what NVML discovery reports on a host that agrees with
// its nvidia-smi: the topo -m matrix and NUMA nodes, and the query's
// UUIDs, memory (in bytes, as NVML counts it) and bus IDs. mutate changes
// the GPUs and links before the topology is built.
func (h hostFixture) discovered(t *testing.T, mutate func(gpus []topology.GPU, links [][]topology.Link)) *topology.Topology {
	t.Helper()
	n := h.topo.Len()
	gpus := append([]topology.GPU(nil), h.topo.GPUs...)
	links := make([][]topology.Link, n)
	for i := range links {
		links[i] = make([]topology.Link, n)
		for j := range links[i] {
			links[i][j] = h.topo.Link(i, j)
		}
	}
	for p := range gpus {
		q := h.query[p]
		if q.Index != gpus[p].Index {
			t.Fatalf("fixture: query line %d is GPU %d, topo row is GPU %d", p, q.Index, gpus[p].Index)
		}
		gpus[p].Minor = gpus[p].Index
		gpus[p].UUID = q.UUID
		gpus[p].MemoryBytes = q.MemoryMiB*mib + 123 // NVML's byte count is not a whole number of MiB
		gpus[p].PCIBusID = q.PCIBusID
	}
	if mutate != nil {
		mutate(gpus, links)
	}
	topo, err := topology.New(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

// results indexes results by check name.
func results(t *testing.T, rs []Result) map[string]Result {
	t.Helper()
	m := map[string]Result{}
	for _, r := range rs {
		if _, dup := m[r.Name]; dup {
			t.Fatalf("check %q reported twice", r.Name)
		}
		m[r.Name] = r
	}
	return m
}

func wantResult(t *testing.T, got map[string]Result, name string, status Status, detailParts ...string) {
	t.Helper()
	r, ok := got[name]
	if !ok {
		t.Fatalf("no result for %q; have %v", name, got)
	}
	if r.Status != status {
		t.Errorf("%s: status %s (%s), want %s", name, r.Status, r.Detail, status)
	}
	for _, p := range detailParts {
		if !strings.Contains(r.Detail, p) {
			t.Errorf("%s: detail %q does not mention %q", name, r.Detail, p)
		}
	}
}
