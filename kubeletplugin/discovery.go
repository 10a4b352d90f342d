package kubeletplugin

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/driver/discovery"
)

// Discovery backends (the --discovery flag).
const (
	DiscoveryNVML         = "nvml"
	DiscoveryMock         = "mock"
	DiscoveryTopologyFile = "topology-file"
)

// DiscoveryOptions choose and configure the GPU discovery backend.
type DiscoveryOptions struct {
	// Backend is DiscoveryNVML, DiscoveryMock or DiscoveryTopologyFile.
	Backend string
	// MockServer names the simulated server of the mock backend ("dgxa100", ...).
	MockServer string
	// MockMIG puts GPUs of the mock backend in MIG mode with instances
	// (discovery.ParseMockMIG: "0:1g.5gb,3g.20gb;1:7g.40gb"), so that MIG
	// nodes can be simulated; empty: no GPU in MIG mode.
	MockMIG string
	// TopologyFile is the `nvidia-smi topo -m` output of the topology-file backend.
	TopologyFile string
	// NodeName seeds the topology-file backend's synthetic UUIDs.
	NodeName string
	// GPUProduct and GPUMemory describe the GPUs of the topology-file backend.
	GPUProduct string
	GPUMemory  resource.Quantity
	// CUDAComputeCapability, Architecture and DriverVersion optionally
	// complete the topology-file backend's GPUs.
	CUDAComputeCapability string
	Architecture          string
	DriverVersion         string
	// DriverRoot is where the host's NVIDIA driver is visible to the
	// plugin ("/" on the host, e.g. /driver-root in the chart's container).
	// The nvml backend loads libnvidia-ml from there, so a container image
	// without the driver library still talks to the host's driver.
	DriverRoot string
}

// nvmlLibraryDirs are the places distributions and the GPU Operator's
// driver container install libnvidia-ml, relative to the driver root.
var nvmlLibraryDirs = []string{
	"usr/lib64",
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"lib64",
	"usr/lib",
	"lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu",
}

// nvmlLibrary returns the NVML library option for a driver root: none for
// "/" (the loader's search path finds the host's library), otherwise the
// first libnvidia-ml.so.1 under the root, and an error naming every place
// looked at when there is none.
func nvmlLibrary(driverRoot string) ([]nvml.LibraryOption, error) {
	if driverRoot == "" || filepath.Clean(driverRoot) == "/" {
		return nil, nil
	}
	var tried []string
	for _, dir := range nvmlLibraryDirs {
		path := filepath.Join(driverRoot, dir, "libnvidia-ml.so.1")
		if _, err := os.Stat(path); err == nil {
			return []nvml.LibraryOption{nvml.WithLibraryPath(path)}, nil
		}
		tried = append(tried, path)
	}
	return nil, fmt.Errorf("--driver-root=%s: libnvidia-ml.so.1 not found (looked in %v); is the NVIDIA driver installed at that root?", driverRoot, tried)
}

// NVMLLibrary returns the NVML library of a driver root as this process
// sees it.
func NVMLLibrary(driverRoot string) (nvml.Interface, error) {
	libOpts, err := nvmlLibrary(driverRoot)
	if err != nil {
		return nil, err
	}
	return nvml.New(libOpts...), nil
}

// RealGPUs reports whether the backend talks to real GPUs, which decides
// whether device nodes must exist and whether MPS daemons are started.
func (o DiscoveryOptions) RealGPUs() bool { return o.Backend == DiscoveryNVML }

// NewDiscoverer builds the discovery backend the options select.
func NewDiscoverer(o DiscoveryOptions) (discovery.Discoverer, error) {
	if o.MockMIG != "" && o.Backend != DiscoveryMock {
		// MIG mode is only ever read from real GPUs, never set.
		return nil, fmt.Errorf("--mock-mig=%q needs --discovery=%s (it is %q)", o.MockMIG, DiscoveryMock, o.Backend)
	}
	switch o.Backend {
	case DiscoveryNVML:
		lib, err := NVMLLibrary(o.DriverRoot)
		if err != nil {
			return nil, err
		}
		return discovery.NewNVML(lib), nil
	case DiscoveryMock:
		if o.MockServer == "" {
			return nil, fmt.Errorf("--discovery=%s needs --mock-server", DiscoveryMock)
		}
		layout, err := discovery.ParseMockMIG(o.MockMIG)
		if err != nil {
			return nil, fmt.Errorf("--mock-mig=%q: %w", o.MockMIG, err)
		}
		d, err := discovery.NewMockWith(o.MockServer, discovery.MockOptions{MIG: layout})
		if err != nil {
			return nil, fmt.Errorf("--mock-server=%s --mock-mig=%q: %w", o.MockServer, o.MockMIG, err)
		}
		return d, nil
	case DiscoveryTopologyFile:
		if o.TopologyFile == "" {
			return nil, fmt.Errorf("--discovery=%s needs --topology-file", DiscoveryTopologyFile)
		}
		d, err := discovery.NewTopologyFile(discovery.TopologyFileOptions{
			Path:                  o.TopologyFile,
			NodeName:              o.NodeName,
			ProductName:           o.GPUProduct,
			Architecture:          o.Architecture,
			CUDAComputeCapability: o.CUDAComputeCapability,
			DriverVersion:         o.DriverVersion,
			MemoryBytes:           o.GPUMemory.Value(),
		})
		if err != nil {
			return nil, fmt.Errorf("topology-file discovery: %w", err)
		}
		return d, nil
	default:
		return nil, fmt.Errorf("--discovery: unknown backend %q (want %s, %s or %s)", o.Backend, DiscoveryNVML, DiscoveryMock, DiscoveryTopologyFile)
	}
}
