package kubeletplugin

import (
	"fmt"

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
}

// RealGPUs reports whether the backend talks to real GPUs, which decides
// whether device nodes must exist and whether MPS daemons are started.
func (o DiscoveryOptions) RealGPUs() bool { return o.Backend == DiscoveryNVML }

// NewDiscoverer builds the discovery backend the options select.
func NewDiscoverer(o DiscoveryOptions) (discovery.Discoverer, error) {
	switch o.Backend {
	case DiscoveryNVML:
		return discovery.NewNVML(nvml.New()), nil
	case DiscoveryMock:
		if o.MockServer == "" {
			return nil, fmt.Errorf("--discovery=%s needs --mock-server", DiscoveryMock)
		}
		d, err := discovery.NewMock(o.MockServer)
		if err != nil {
			return nil, fmt.Errorf("--mock-server: %w", err)
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
