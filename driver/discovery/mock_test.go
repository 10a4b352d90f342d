package discovery

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulink/gpulink/driver/topology"
)

// uniformRows is the matrix of n GPUs all linked by l.
func uniformRows(n int, l topology.Link) []string {
	rows := make([]string, n)
	for i := range n {
		cells := make([]string, n)
		for j := range n {
			cells[j] = l.String()
		}
		cells[i] = "X"
		rows[i] = strings.Join(cells, " ")
	}
	return rows
}

func TestNewMock(t *testing.T) {
	tests := []struct {
		server        string
		gpu           gpus.Config
		arch          string
		driverVersion string
		link          topology.Link
		numa          []int
		roots         []string
	}{{
		server: "dgxa100", gpu: gpus.A100_SXM4_40GB, arch: "ampere", driverVersion: "550.54.15",
		link:  topology.NVLink(12),
		numa:  []int{3, 3, 1, 1, 7, 7, 5, 5},
		roots: []string{"pci0000:00", "pci0000:00", "pci0000:40", "pci0000:40", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"},
	}, {
		server: "dgxh100", gpu: gpus.H100_SXM5_80GB, arch: "hopper", driverVersion: "550.54.15",
		link:  topology.NVLink(18),
		numa:  []int{0, 0, 0, 0, 1, 1, 1, 1},
		roots: []string{"pci0000:15", "pci0000:3d", "pci0000:4c", "pci0000:5b", "pci0000:97", "pci0000:bd", "pci0000:cb", "pci0000:d9"},
	}, {
		server: "dgxh200", gpu: gpus.H200_SXM5_141GB, arch: "hopper", driverVersion: "550.54.15",
		link:  topology.NVLink(18),
		numa:  []int{0, 0, 0, 0, 1, 1, 1, 1},
		roots: []string{"pci0000:15", "pci0000:3d", "pci0000:4c", "pci0000:5b", "pci0000:97", "pci0000:bd", "pci0000:cb", "pci0000:d9"},
	}, {
		server: "dgxb200", gpu: gpus.B200_SXM5_180GB, arch: "blackwell", driverVersion: "560.28.03",
		link:  topology.NVLink(18),
		numa:  []int{0, 0, 0, 0, 1, 1, 1, 1},
		roots: []string{"pci0000:15", "pci0000:3d", "pci0000:4c", "pci0000:5b", "pci0000:97", "pci0000:bd", "pci0000:cb", "pci0000:d9"},
	}}
	for _, tc := range tests {
		t.Run(tc.server, func(t *testing.T) {
			d, err := NewMock(tc.server)
			if err != nil {
				t.Fatalf("NewMock: %v", err)
			}
			topo, err := d.Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if topo.Len() != 8 {
				t.Fatalf("got %d GPUs, want 8", topo.Len())
			}
			sameRows(t, matrix(topo), uniformRows(8, tc.link))
			uuids := map[string]bool{}
			for p, g := range topo.GPUs {
				if g.Index != p || g.Minor != p {
					t.Errorf("position %d: index %d minor %d, want both %d", p, g.Index, g.Minor, p)
				}
				if !strings.HasPrefix(g.UUID, "GPU-") || uuids[g.UUID] {
					t.Errorf("GPU %d: UUID %q is not a fresh GPU- UUID", p, g.UUID)
				}
				uuids[g.UUID] = true
				wantCC := fmt.Sprintf("%d.%d", tc.gpu.CudaMajor, tc.gpu.CudaMinor)
				if g.ProductName != tc.gpu.Name || g.Architecture != tc.arch || g.CUDAComputeCapability != wantCC ||
					g.MemoryBytes != int64(tc.gpu.MemoryMB)<<20 || g.DriverVersion != tc.driverVersion {
					t.Errorf("GPU %d: got %q %q %q %d bytes driver %q, want %q %q %q %d bytes driver %q", p,
						g.ProductName, g.Architecture, g.CUDAComputeCapability, g.MemoryBytes, g.DriverVersion,
						tc.gpu.Name, tc.arch, wantCC, int64(tc.gpu.MemoryMB)<<20, tc.driverVersion)
				}
				if want := mockMachines[tc.server].gpus[p].busID; g.PCIBusID != want {
					t.Errorf("GPU %d: bus ID %q, want %q", p, g.PCIBusID, want)
				}
				if g.PCIeRoot != tc.roots[p] || g.NUMANode != tc.numa[p] {
					t.Errorf("GPU %d: root %q NUMA %d, want %q %d", p, g.PCIeRoot, g.NUMANode, tc.roots[p], tc.numa[p])
				}
				if g.CPUAffinity == "" {
					t.Errorf("GPU %d: no CPU affinity", p)
				}
			}
		})
	}
}

func TestNewMockUnknownServer(t *testing.T) {
	_, err := NewMock("dgx-1")
	if err == nil {
		t.Fatal("NewMock(dgx-1) succeeded, want an error")
	}
	for _, want := range []string{`"dgx-1"`, "dgxa100, dgxb200, dgxh100, dgxh200"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// TestMockMatchesServer checks that discovery reports what the go-nvml
// server simulates, and that the installed bus IDs are the ones the server
// resolves handles by.
func TestMockMatchesServer(t *testing.T) {
	m := mockMachines["dgxa100"]
	s := m.newServer()
	if err := m.install(s); err != nil {
		t.Fatalf("install: %v", err)
	}
	topo, err := newNVML(s, m.sysfs()).Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	for p, g := range topo.GPUs {
		dev := s.Devices[p].(*server.Device)
		if g.UUID != dev.UUID {
			t.Errorf("GPU %d: UUID %q, server has %q", p, g.UUID, dev.UUID)
		}
		h, ret := s.DeviceGetHandleByPciBusId(g.PCIBusID)
		if ret != nvml.SUCCESS || h != s.Devices[p] {
			t.Errorf("GPU %d: DeviceGetHandleByPciBusId(%s) = %v, %v; want GPU %d", p, g.PCIBusID, h, ret, p)
		}
		info, _ := dev.GetPciInfo()
		if info.PciDeviceId != gpus.A100_SXM4_40GB.PciDeviceId {
			t.Errorf("GPU %d: PCI device ID %#x, want the server's %#x", p, info.PciDeviceId, gpus.A100_SXM4_40GB.PciDeviceId)
		}
	}
	if n, m := len(s.InitCalls()), len(s.ShutdownCalls()); n != 1 || m != 1 {
		t.Errorf("Init called %d times, Shutdown %d times; want once each", n, m)
	}
}

// TestMockPCIeLayout hides the NVLinks to check the PCIe layout the mock
// installs, and that install keeps functions the server already has.
func TestMockPCIeLayout(t *testing.T) {
	tests := []struct {
		server string
		want   []string
	}{{
		server: "dgxa100",
		want: []string{
			"X PXB NODE NODE SYS SYS SYS SYS",
			"PXB X NODE NODE SYS SYS SYS SYS",
			"NODE NODE X PXB SYS SYS SYS SYS",
			"NODE NODE PXB X SYS SYS SYS SYS",
			"SYS SYS SYS SYS X PXB NODE NODE",
			"SYS SYS SYS SYS PXB X NODE NODE",
			"SYS SYS SYS SYS NODE NODE X PXB",
			"SYS SYS SYS SYS NODE NODE PXB X",
		},
	}, {
		server: "dgxh100",
		want: []string{
			"X NODE NODE NODE SYS SYS SYS SYS",
			"NODE X NODE NODE SYS SYS SYS SYS",
			"NODE NODE X NODE SYS SYS SYS SYS",
			"NODE NODE NODE X SYS SYS SYS SYS",
			"SYS SYS SYS SYS X NODE NODE NODE",
			"SYS SYS SYS SYS NODE X NODE NODE",
			"SYS SYS SYS SYS NODE NODE X NODE",
			"SYS SYS SYS SYS NODE NODE NODE X",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.server, func(t *testing.T) {
			m := mockMachines[tc.server]
			s := m.newServer()
			for _, d := range s.Devices {
				d.(*server.Device).GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) {
					return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
				}
			}
			if err := m.install(s); err != nil {
				t.Fatalf("install: %v", err)
			}
			topo, err := newNVML(s, m.sysfs()).Discover(context.Background())
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			sameRows(t, matrix(topo), tc.want)
		})
	}
}

func TestMockInstallRejectsMismatchedServer(t *testing.T) {
	m := mockMachines["dgxh100"]
	s, err := server.New(server.WithGPUs(gpus.Multiple(4, gpus.H100_SXM5_80GB)...))
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	err = m.install(s)
	if err == nil || !strings.Contains(err.Error(), "4 GPUs") {
		t.Fatalf("install on a 4-GPU server: got %v, want an error about 4 GPUs", err)
	}
}

func TestMockConcurrentDiscover(t *testing.T) {
	d, err := NewMock("dgxh100")
	if err != nil {
		t.Fatalf("NewMock: %v", err)
	}
	first, err := d.Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for w := range errs {
		wg.Go(func() {
			topo, err := d.Discover(context.Background())
			if err != nil {
				errs[w] = err
				return
			}
			for p := range topo.GPUs {
				if topo.GPUs[p] != first.GPUs[p] {
					errs[w] = fmt.Errorf("GPU %d changed between discoveries: %+v vs %+v", p, topo.GPUs[p], first.GPUs[p])
					return
				}
			}
		})
	}
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Errorf("worker %d: %v", w, err)
		}
	}
}
