package kubeletplugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/internal/sliceformat"
)

func TestNewDiscoverer(t *testing.T) {
	for name, tc := range map[string]struct {
		opts DiscoveryOptions
		want string
	}{
		"unknown backend":        {DiscoveryOptions{Backend: "magic"}, `unknown backend "magic"`},
		"mock without server":    {DiscoveryOptions{Backend: DiscoveryMock}, "--mock-server"},
		"unknown mock server":    {DiscoveryOptions{Backend: DiscoveryMock, MockServer: "dgx9000"}, "dgx9000"},
		"topology-file, no file": {DiscoveryOptions{Backend: DiscoveryTopologyFile}, "--topology-file"},
		"MIG without mock":       {DiscoveryOptions{Backend: DiscoveryNVML, MockMIG: "0:1g.5gb"}, `--mock-mig="0:1g.5gb" needs --discovery=mock`},
		"malformed MIG layout":   {DiscoveryOptions{Backend: DiscoveryMock, MockServer: "dgxa100", MockMIG: "zero:1g.5gb"}, `--mock-mig="zero:1g.5gb"`},
		"unknown MIG profile":    {DiscoveryOptions{Backend: DiscoveryMock, MockServer: "dgxa100", MockMIG: "0:2g.80gb"}, `"2g.80gb"`},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewDiscoverer(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}

	d, err := NewDiscoverer(DiscoveryOptions{
		Backend: DiscoveryTopologyFile, TopologyFile: filepath.Join("testdata", "pcie-4.txt"),
		NodeName: testNode, GPUProduct: "NVIDIA A100-PCIE-40GB", GPUMemory: resource.MustParse("40Gi"),
	})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := d.Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if topo.Len() != 4 || topo.GPUs[0].MemoryBytes != 40<<30 || topo.GPUs[0].ProductName != "NVIDIA A100-PCIE-40GB" {
		t.Errorf("topology-file discovery: %+v", topo.GPUs)
	}
	// Its slices pass the API limits as they are.
	if _, err := driverResources(testLogger(t), testNode, topo, defaultSliceOptions()); err != nil {
		t.Fatal(err)
	}

	mock, err := NewDiscoverer(DiscoveryOptions{Backend: DiscoveryMock, MockServer: "dgxa100"})
	if err != nil {
		t.Fatal(err)
	}
	topo, err = mock.Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	res, err := driverResources(testLogger(t), testNode, topo, defaultSliceOptions())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Pools[testNode].Slices[0].Devices); n != 8 {
		t.Errorf("dgxa100 mock: %d devices, want 8", n)
	}

	// --mock-mig: GPU 0 in MIG mode is published as its two MIG devices.
	mock, err = NewDiscoverer(DiscoveryOptions{Backend: DiscoveryMock, MockServer: "dgxa100", MockMIG: "0:1g.5gb,3g.20gb"})
	if err != nil {
		t.Fatal(err)
	}
	if topo, err = mock.Discover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if res, err = driverResources(testLogger(t), testNode, topo, defaultSliceOptions()); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range res.Pools[testNode].Slices {
		for _, d := range s.Devices {
			names = append(names, d.Name)
		}
	}
	if len(names) != 9 || !slices.Contains(names, "gpu-0-mig-0-0") || !slices.Contains(names, "gpu-0-mig-1-0") || slices.Contains(names, "gpu-0") {
		t.Errorf("dgxa100 mock with GPU 0 in MIG mode: devices %v, want gpu-1..7 and gpu-0's two MIG devices", names)
	}
}

func TestNVMLLibraryUnderDriverRoot(t *testing.T) {
	root := t.TempDir()
	if opts, err := nvmlLibrary("/"); err != nil || opts != nil {
		t.Fatalf("host root: got %v, %v; want the loader's search path", opts, err)
	}
	_, err := nvmlLibrary(root)
	if err == nil || !strings.Contains(err.Error(), "--driver-root="+root) || !strings.Contains(err.Error(), "libnvidia-ml.so.1") {
		t.Fatalf("empty driver root: error %v, want one naming the flag, the root and the library", err)
	}
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := nvmlLibrary(root)
	if err != nil || len(opts) != 1 {
		t.Fatalf("driver root with library: got %d options, %v; want one library path option", len(opts), err)
	}
	d, err := NewDiscoverer(DiscoveryOptions{Backend: DiscoveryNVML, DriverRoot: root})
	if err != nil || d == nil {
		t.Fatalf("NewDiscoverer(nvml, driver root with library): %v", err)
	}
}

func defaultSliceOptions() sliceformat.Options {
	return sliceformat.Options{ManagedByController: true, DefaultShareMemory: resource.MustParse("4Gi"), DefaultShareCores: 25}
}
