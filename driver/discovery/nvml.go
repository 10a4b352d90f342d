package discovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulink/gpulink/driver/topology"
)

// nvmlDiscoverer reads GPUs and their links from NVML, and the facts NVML
// does not report (PCIe root, NUMA node on x86, CPU affinity) from sysfs.
type nvmlDiscoverer struct {
	lib nvml.Interface
	sys sysfs
	// proc is procfs, for the MIG capability table (mig.go); nil: none,
	// MIG devices then have unknown cap minors.
	proc fs.FS
}

// NewNVML returns a Discoverer backed by lib: the real library
// (nvml.New(...)) or any mock nvml.Interface. A nil lib means nvml.New(),
// which loads libnvidia-ml.so.1 from the loader path. Each Discover calls
// Init and Shutdown, so no NVML state outlives a discovery and a driver
// reload between two calls is picked up.
func NewNVML(lib nvml.Interface) Discoverer {
	d := newNVML(lib, os.DirFS(hostSysfsRoot).(fs.ReadLinkFS))
	d.proc = os.DirFS(hostProcRoot)
	return d
}

func newNVML(lib nvml.Interface, sysRoot fs.ReadLinkFS) *nvmlDiscoverer {
	if lib == nil {
		lib = nvml.New()
	}
	return &nvmlDiscoverer{lib: lib, sys: sysfs{fsys: sysRoot}}
}

// Discover initializes NVML, reads every GPU and every pair's link, and
// shuts NVML down again.
func (d *nvmlDiscoverer) Discover(ctx context.Context) (topo *topology.Topology, err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discover GPUs through NVML: %w", err)
	}
	if ret := d.lib.Init(); ret != nvml.SUCCESS {
		return nil, initError(ret)
	}
	defer func() {
		if ret := d.lib.Shutdown(); ret != nvml.SUCCESS {
			// A library that cannot shut down cleanly is in a state
			// whose answers are not worth publishing.
			topo, err = nil, errors.Join(err, fmt.Errorf("shut down NVML: %w", ret))
		}
	}()

	devs, err := d.devices(ctx)
	if err != nil {
		return nil, err
	}
	links, err := d.links(ctx, devs)
	if err != nil {
		return nil, err
	}
	gpus := make([]topology.GPU, len(devs))
	for p, dev := range devs {
		gpus[p] = dev.gpu
	}
	t, err := topology.New(gpus, links)
	if err != nil {
		return nil, fmt.Errorf("build topology from NVML: %w", err)
	}
	return t, nil
}

// initError explains the two failures an operator can fix: the library is
// not where the loader looks, or the kernel module is not loaded.
func initError(ret nvml.Return) error {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("initialize NVML: %w: libnvidia-ml.so.1 is not on the library search path; "+
			"install the NVIDIA driver on the node, or mount the driver root (/ for a host install, "+
			"/run/nvidia/driver when the GPU Operator installs the driver) into the plugin container "+
			"and put its lib directory on LD_LIBRARY_PATH", ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("initialize NVML: %w: the NVIDIA kernel module is not loaded on this node", ret)
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("initialize NVML: %w: the plugin may not open /dev/nvidiactl; run it privileged or with the NVIDIA device nodes mounted", ret)
	}
	return fmt.Errorf("initialize NVML: %w", ret)
}

// device is one GPU as NVML enumerated it, with its handle for link queries.
type device struct {
	handle nvml.Device
	gpu    topology.GPU
}

// devices reads every GPU NVML enumerates, in index order.
func (d *nvmlDiscoverer) devices(ctx context.Context) ([]device, error) {
	count, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("DeviceGetCount: %w", ret)
	}
	if count < 0 || count > topology.MaxGPUs {
		return nil, fmt.Errorf("DeviceGetCount returned %d GPUs, want 0..%d", count, topology.MaxGPUs)
	}
	driverVersion := ""
	if count > 0 {
		v, ret := d.lib.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("SystemGetDriverVersion: %w", ret)
		}
		driverVersion = v
	}
	caps, err := readMIGCaps(d.proc)
	if err != nil {
		return nil, err
	}
	devs := make([]device, 0, count)
	byBusID := make(map[string]int, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("discover GPUs through NVML: %w", err)
		}
		h, ret := d.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, callError(i, "DeviceGetHandleByIndex", ret)
		}
		gpu, err := d.readGPU(i, h)
		if err != nil {
			return nil, err
		}
		gpu.DriverVersion = driverVersion
		if gpu.MIG, err = d.readMIG(gpu.Index, h, gpu.MemoryBytes, gpu.Minor, caps); err != nil {
			return nil, err
		}
		if other, dup := byBusID[gpu.PCIBusID]; dup {
			return nil, fmt.Errorf("GPU %d and GPU %d both report PCI bus ID %s", other, gpu.Index, gpu.PCIBusID)
		}
		byBusID[gpu.PCIBusID] = gpu.Index
		devs = append(devs, device{handle: h, gpu: gpu})
	}
	slices.SortFunc(devs, func(a, b device) int { return a.gpu.Index - b.gpu.Index })
	return devs, nil
}

// callError names the GPU and the NVML call that failed and keeps the
// nvml.Return in the chain so callers can errors.Is it.
func callError(index int, call string, ret nvml.Return) error {
	return fmt.Errorf("GPU %d: %s: %w", index, call, ret)
}

// unavailable reports whether ret means "this GPU, driver or library
// cannot answer", which discovery treats as "unknown", not as a failure.
func unavailable(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}
