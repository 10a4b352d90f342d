package gpucheck

import (
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

func TestParseQueryGPU(t *testing.T) {
	h := loadHost(t, "dgx-a100")
	if len(h.query) != 8 {
		t.Fatalf("%d GPUs, want 8", len(h.query))
	}
	want := SMIGPU{Index: 1, UUID: "GPU-a1000001-0000-4000-8000-000000000001", MemoryMiB: 40960, PCIBusID: "0000:0f:00.0"}
	if h.query[1] != want {
		t.Errorf("GPU 1 = %+v, want %+v", h.query[1], want)
	}
	// Lines in any order come back in index order.
	got, err := ParseQueryGPU(strings.NewReader("1, GPU-b, 10, 0000:02:00.0\n\n0, GPU-a, 10, 0000:01:00.0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].UUID != "GPU-a" || got[1].UUID != "GPU-b" {
		t.Errorf("order: %+v", got)
	}
}

func TestParseQueryGPUErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "printed no GPU"},
		{"0, GPU-a, 10\n", "want 4 comma-separated fields"},
		{"x, GPU-a, 10, 0000:01:00.0\n", `index "x"`},
		{"0, GPU-a, 10, 0000:01:00.0\n0, GPU-b, 10, 0000:02:00.0\n", "index 0 already on line 1"},
		{"0, a100, 10, 0000:01:00.0\n", `uuid "a100"`},
		{"0, GPU-a, 10 MiB, 0000:01:00.0\n", `memory.total "10 MiB"`},
		{"0, GPU-a, 10, 01:00\n", `pci.bus_id: PCI bus ID "01:00"`},
	} {
		_, err := ParseQueryGPU(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseQueryGPU(%q) = %v, want error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestCompareQueryGPU(t *testing.T) {
	h := loadHost(t, "dgx-a100")
	got := results(t, CompareQueryGPU(h.discovered(t, nil), h.query))
	wantResult(t, got, CheckSMIGPUs, Pass, "8 GPU(s)", "0=GPU-a1000000-0000-4000-8000-000000000000")
	wantResult(t, got, CheckSMIMemory, Pass, "7=40960MiB")
	wantResult(t, got, CheckSMIBusIDs, Pass, "3=0000:4e:00.0")

	bad := h.discovered(t, func(gpus []topology.GPU, _ [][]topology.Link) {
		gpus[2].UUID = "GPU-other"
		gpus[3].MemoryBytes = 40958 * mib
		gpus[5].PCIBusID = "0000:91:00.0"
	})
	got = results(t, CompareQueryGPU(bad, h.query))
	wantResult(t, got, CheckSMIGPUs, Fail, `GPU 2: NVML UUID "GPU-other", nvidia-smi "GPU-a1000002-0000-4000-8000-000000000002"`)
	wantResult(t, got, CheckSMIMemory, Fail, "GPU 3: NVML 42947575808 bytes (40958 MiB), nvidia-smi 40960 MiB")
	wantResult(t, got, CheckSMIBusIDs, Fail, `GPU 5: NVML "0000:91:00.0", nvidia-smi "0000:90:00.0"`)
}

func TestCompareQueryGPUMissingGPUs(t *testing.T) {
	h := loadHost(t, "dgx-a100")
	got := results(t, CompareQueryGPU(h.discovered(t, nil), h.query[:7]))
	wantResult(t, got, CheckSMIGPUs, Fail, "GPU 7 (GPU-a1000007-0000-4000-8000-000000000007) found by NVML is not in nvidia-smi's list")
	one := loadHost(t, "h100-1")
	got = results(t, CompareQueryGPU(one.discovered(t, nil), append(one.query, SMIGPU{Index: 1, UUID: "GPU-x"})))
	wantResult(t, got, CheckSMIGPUs, Fail, "GPU 1 (GPU-x) listed by nvidia-smi was not found by NVML discovery")
}

func TestCompareTopo(t *testing.T) {
	h := loadHost(t, "dgx-a100")
	got := results(t, CompareTopo(h.discovered(t, nil), h.topo))
	wantResult(t, got, CheckTopoGPUs, Pass, "8 GPU(s)")
	wantResult(t, got, CheckTopoLinks, Pass, "28 pairs equal")

	// NVML saw one NVLink bond fewer between GPU1 and GPU6.
	got = results(t, CompareTopo(h.discovered(t, func(_ []topology.GPU, l [][]topology.Link) {
		l[1][6], l[6][1] = topology.NVLink(11), topology.NVLink(11)
	}), h.topo))
	wantResult(t, got, CheckTopoLinks, Fail, "GPU1-GPU6: NVML NV11, topo -m NV12")
	wantResult(t, got, CheckTopoGPUs, Pass)

	got = results(t, CompareTopo(h.discovered(t, func(g []topology.GPU, _ [][]topology.Link) { g[4].NUMANode = 6 }), h.topo))
	wantResult(t, got, CheckTopoGPUs, Fail, "GPU 4: NUMA node 6 from discovery, 7 in topo -m")
	wantResult(t, got, CheckTopoLinks, Fail, "GPU sets differ")
}

func TestCompareTopoOneGPU(t *testing.T) {
	h := loadHost(t, "h100-1")
	got := results(t, CompareTopo(h.discovered(t, nil), h.topo))
	wantResult(t, got, CheckTopoGPUs, Pass, "1 GPU(s)")
	wantResult(t, got, CheckTopoLinks, Skip, "no pair of GPUs")

	// A GPU discovery found that topo -m does not list.
	a100 := loadHost(t, "dgx-a100")
	got = results(t, CompareTopo(a100.discovered(t, nil), h.topo))
	wantResult(t, got, CheckTopoGPUs, Fail, "GPU 1 found by NVML has no row in topo -m")
}
