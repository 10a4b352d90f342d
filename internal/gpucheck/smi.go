package gpucheck

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
)

// QueryGPUArgs are the nvidia-smi arguments whose output ParseQueryGPU
// reads. The index is queried too so that GPUs are matched by the number
// both nvidia-smi and NVML give them, not by line order.
var QueryGPUArgs = []string{"--query-gpu=index,uuid,memory.total,pci.bus_id", "--format=csv,noheader,nounits"}

// TopoArgs print the link matrix topology.Parse reads.
var TopoArgs = []string{"topo", "-m"}

// SMIGPU is one line of nvidia-smi --query-gpu output.
type SMIGPU struct {
	Index int
	UUID  string
	// MemoryMiB is memory.total, which nvidia-smi prints in MiB.
	MemoryMiB int64
	// PCIBusID is canonical (discovery.CanonicalBusID).
	PCIBusID string
}

// ParseQueryGPU reads the CSV that nvidia-smi prints for QueryGPUArgs,
// one GPU per line, and returns the GPUs in index order.
func ParseQueryGPU(r io.Reader) ([]SMIGPU, error) {
	var out []SMIGPU
	seen := map[int]int{}
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		cells := strings.Split(text, ",")
		if len(cells) != 4 {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d: %q: want 4 comma-separated fields (index, uuid, memory.total, pci.bus_id), got %d", line, text, len(cells))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		idx, err := strconv.Atoi(cells[0])
		if err != nil || idx < 0 {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d: index %q: want a non-negative integer", line, cells[0])
		}
		if prev, dup := seen[idx]; dup {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d: index %d already on line %d", line, idx, prev)
		}
		seen[idx] = line
		if !strings.HasPrefix(cells[1], "GPU-") && !strings.HasPrefix(cells[1], "MIG-") {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d: uuid %q: want GPU-<hex> or MIG-<hex>", line, cells[1])
		}
		mem, err := strconv.ParseInt(cells[2], 10, 64)
		if err != nil || mem <= 0 {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d: memory.total %q: want a positive number of MiB (was --format=csv,nounits used?)", line, cells[2])
		}
		bus, err := discovery.CanonicalBusID(cells[3])
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d: pci.bus_id: %w", line, err)
		}
		out = append(out, SMIGPU{Index: idx, UUID: cells[1], MemoryMiB: mem, PCIBusID: bus})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading nvidia-smi --query-gpu output: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("nvidia-smi --query-gpu printed no GPU")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

const mib = int64(1) << 20

// Check names of the discovery comparison.
const (
	CheckSMIGPUs   = "discovery: GPUs and UUIDs = nvidia-smi"
	CheckSMIMemory = "discovery: memory = nvidia-smi"
	CheckSMIBusIDs = "discovery: PCI bus IDs = nvidia-smi"
	CheckTopoGPUs  = "discovery: GPUs and NUMA = topo -m"
	CheckTopoLinks = "discovery: link matrix = topo -m"
)

// CompareQueryGPU compares what discovery found with nvidia-smi's list:
// the same GPU indices with the same UUIDs, memory within 1 MiB (nvidia-smi
// rounds NVML's byte count down to MiB), and the same PCI bus IDs.
func CompareQueryGPU(t *topology.Topology, smi []SMIGPU) []Result {
	byIndex := map[int]SMIGPU{}
	for _, g := range smi {
		byIndex[g.Index] = g
	}
	var idErrs, memErrs, busErrs, ok, mem, bus []string
	for _, g := range t.GPUs {
		s, found := byIndex[g.Index]
		if !found {
			idErrs = append(idErrs, fmt.Sprintf("GPU %d (%s) found by NVML is not in nvidia-smi's list", g.Index, g.UUID))
			continue
		}
		delete(byIndex, g.Index)
		if s.UUID != g.UUID {
			idErrs = append(idErrs, fmt.Sprintf("GPU %d: NVML UUID %q, nvidia-smi %q", g.Index, g.UUID, s.UUID))
		} else {
			ok = append(ok, fmt.Sprintf("%d=%s", g.Index, g.UUID))
		}
		if d := g.MemoryBytes/mib - s.MemoryMiB; d < -1 || d > 1 {
			memErrs = append(memErrs, fmt.Sprintf("GPU %d: NVML %d bytes (%d MiB), nvidia-smi %d MiB", g.Index, g.MemoryBytes, g.MemoryBytes/mib, s.MemoryMiB))
		} else {
			mem = append(mem, fmt.Sprintf("%d=%dMiB", g.Index, s.MemoryMiB))
		}
		if s.PCIBusID != g.PCIBusID {
			busErrs = append(busErrs, fmt.Sprintf("GPU %d: NVML %q, nvidia-smi %q", g.Index, g.PCIBusID, s.PCIBusID))
		} else {
			bus = append(bus, fmt.Sprintf("%d=%s", g.Index, s.PCIBusID))
		}
	}
	for _, s := range smi {
		if _, left := byIndex[s.Index]; left {
			idErrs = append(idErrs, fmt.Sprintf("GPU %d (%s) listed by nvidia-smi was not found by NVML discovery", s.Index, s.UUID))
		}
	}
	return []Result{
		verdict(CheckSMIGPUs, idErrs, fmt.Sprintf("%d GPU(s): %s", len(t.GPUs), strings.Join(ok, " "))),
		verdict(CheckSMIMemory, memErrs, strings.Join(mem, " ")),
		verdict(CheckSMIBusIDs, busErrs, strings.Join(bus, " ")),
	}
}

// CompareTopo compares discovery's link matrix with the one nvidia-smi
// topo -m printed: the same GPU indices, NUMA nodes where both know them,
// and the same link class for every pair. With one GPU there is no pair,
// and the matrix check is skipped rather than passed.
func CompareTopo(t, smi *topology.Topology) []Result {
	var gpuErrs []string
	for _, g := range t.GPUs {
		p, ok := smi.Position(g.Index)
		if !ok {
			gpuErrs = append(gpuErrs, fmt.Sprintf("GPU %d found by NVML has no row in topo -m", g.Index))
			continue
		}
		if sn, dn := smi.GPUs[p].NUMANode, g.NUMANode; sn >= 0 && dn >= 0 && sn != dn {
			gpuErrs = append(gpuErrs, fmt.Sprintf("GPU %d: NUMA node %d from discovery, %d in topo -m", g.Index, dn, sn))
		}
	}
	for _, s := range smi.GPUs {
		if _, ok := t.Position(s.Index); !ok {
			gpuErrs = append(gpuErrs, fmt.Sprintf("GPU %d of topo -m was not found by NVML discovery", s.Index))
		}
	}
	gpus := verdict(CheckTopoGPUs, gpuErrs, fmt.Sprintf("%d GPU(s) in both", t.Len()))
	if len(gpuErrs) > 0 {
		return []Result{gpus, {Name: CheckTopoLinks, Status: Fail, Detail: "not compared: the GPU sets differ"}}
	}
	if t.Len() < 2 {
		return []Result{gpus, {Name: CheckTopoLinks, Status: Skip, Detail: fmt.Sprintf("%d GPU on this host: no pair of GPUs, no link to compare", t.Len())}}
	}
	var linkErrs []string
	pairs := 0
	for i := range t.Len() {
		for j := i + 1; j < t.Len(); j++ {
			a, b := t.GPUs[i].Index, t.GPUs[j].Index
			si, _ := smi.Position(a)
			sj, _ := smi.Position(b)
			pairs++
			if got, want := t.Link(i, j), smi.Link(si, sj); got != want {
				linkErrs = append(linkErrs, fmt.Sprintf("GPU%d-GPU%d: NVML %s, topo -m %s", a, b, got, want))
			}
		}
	}
	return []Result{gpus, verdict(CheckTopoLinks, linkErrs, fmt.Sprintf("%d pairs equal", pairs))}
}

// verdict is a failure listing errs, or a pass with detail.
func verdict(name string, errs []string, detail string) Result {
	if len(errs) > 0 {
		return Result{Name: name, Status: Fail, Detail: strings.Join(errs, "; ")}
	}
	return Result{Name: name, Status: Pass, Detail: detail}
}
