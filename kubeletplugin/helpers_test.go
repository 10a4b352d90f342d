package kubeletplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/uuid"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/driver/topology/topologytest"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/gpulink/gpulink/kubeletplugin/mps/mpstest"
)

const testNode = "node-a"

const gib = int64(1) << 30

// loadTopology is a testdata topology with the identity NVML discovery
// would report.
func loadTopology(t testing.TB, file string) *topology.Topology {
	t.Helper()
	return topologytest.Load(t, filepath.Join("testdata", file))
}

// fakeDiscoverer returns a settable topology.
type fakeDiscoverer struct {
	mu    sync.Mutex
	topo  *topology.Topology
	err   error
	calls int
}

func (f *fakeDiscoverer) Discover(context.Context) (*topology.Topology, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.topo, f.err
}

func (f *fakeDiscoverer) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *fakeDiscoverer) set(t *topology.Topology, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.topo, f.err = t, err
}

// env is one simulated node: directories and seams shared by successive
// Driver instances (restarts).
type env struct {
	t          testing.TB
	ctx        context.Context
	dir        string
	cdiDir     string
	pluginDir  string
	driverRoot string
	mpsRoot    string
	bootID     string
	disc       *fakeDiscoverer
	daemon     *mpstest.FakeDaemon
	opts       Options
	// mig creates MIG instances (MIG on demand); nil: none.
	mig MIGInstanceManager
	// live, when set, discovers instead of disc: a simulated node whose
	// MIG instances show as they are created and destroyed.
	live discovery.Discoverer
}

func newEnv(t testing.TB, topo *topology.Topology) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	e := &env{
		t: t, ctx: ctx, dir: dir,
		cdiDir:     filepath.Join(dir, "cdi"),
		pluginDir:  filepath.Join(dir, "plugin"),
		driverRoot: filepath.Join(dir, "driver-root"),
		mpsRoot:    filepath.Join(dir, "mps"),
		bootID:     "boot-1",
		disc:       &fakeDiscoverer{topo: topo},
		daemon:     mpstest.NewFakeDaemon(),
	}
	e.opts = Options{
		NodeName:            testNode,
		PluginDataDir:       e.pluginDir,
		DriverRoot:          e.driverRoot,
		ManagedByController: true,
		DefaultShareMemory:  resource.MustParse("4Gi"),
		DefaultShareCores:   25,
	}
	// Device nodes: symlinks to /dev/null, a real character device, so the
	// CDI library can resolve them when injecting.
	devDir := filepath.Join(e.driverRoot, "dev")
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for _, g := range topo.GPUs {
		names = append(names, fmt.Sprintf("nvidia%d", g.Minor))
	}
	for _, n := range names {
		if err := os.Symlink("/dev/null", filepath.Join(devDir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// start creates a Driver on the env, as a (re)started plugin would.
func (e *env) start() *Driver {
	e.t.Helper()
	d, err := e.newDriver()
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *env) newDriver() (*Driver, error) {
	cdi, err := NewCDIDir(e.cdiDir)
	if err != nil {
		return nil, err
	}
	var disc discovery.Discoverer = e.disc
	if e.live != nil {
		disc = e.live
	}
	return New(e.ctx, e.opts, Dependencies{
		Discoverer: disc,
		CDI:        cdi,
		MPS:        mps.NewManager(e.mpsRoot, e.daemon),
		BootID:     func() (string, error) { return e.bootID, nil },
		MIG:        e.mig,
	})
}

func (e *env) specPath(uid types.UID) string {
	return filepath.Join(e.cdiDir, specFileName(uid))
}

func (e *env) specExists(uid types.UID) bool {
	_, err := os.Stat(e.specPath(uid))
	return err == nil
}

// Claim builders.

func newClaim(name string, results []resourceapi.DeviceRequestAllocationResult, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	now := metav1.Now()
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uuid.NewString())},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices:             resourceapi.DeviceAllocationResult{Results: results, Config: configs},
			AllocationTimestamp: &now,
		}},
	}
}

func wholeGPU(request string, index int) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: driver.Name, Pool: testNode, Device: driver.DeviceName(index),
	}
}

func shareOf(request string, index int, memory string, cores int64) resourceapi.DeviceRequestAllocationResult {
	r := wholeGPU(request, index)
	id := types.UID(uuid.NewString())
	r.ShareID = &id
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		driver.CapacityMemory: resource.MustParse(memory),
		driver.CapacityCores:  *resource.NewQuantity(cores, resource.DecimalSI),
	}
	return r
}

func opaqueEntry(source resourceapi.AllocationConfigSource, drv string, requests []string, raw string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: drv, Parameters: runtime.RawExtension{Raw: []byte(raw)},
		}},
	}
}

func sharingConfig(strategy string) string {
	return `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"` + strategy + `"}}`
}
