package gpucheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// Preparer prepares claims the way the kubelet asks the plugin to, and
// says where the CDI specs of the devices it returns live. It is the seam
// between the suite and the kubelet plugin: when the plugin's constructor
// or its CDI layout changes (a per-node base spec, an MPS helper), only
// NewPluginPreparer changes; the suite resolves whatever CDI device IDs
// the plugin hands the kubelet, in whatever spec files it wrote.
type Preparer interface {
	// Prepare returns the CDI device IDs the kubelet would pass to the
	// container runtime for the claim.
	Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]string, error)
	Unprepare(ctx context.Context, claim *resourceapi.ResourceClaim) error
	// SpecDirs are the CDI spec directories to resolve the IDs in.
	SpecDirs() []string
}

// PluginPreparerOptions configure the kubelet plugin the suite drives.
type PluginPreparerOptions struct {
	// WorkDir gets the plugin's data (checkpoint), CDI and MPS directories.
	WorkDir  string
	NodeName string
	// Discoverer is the plugin's discovery backend.
	Discoverer discovery.Discoverer
	// RealGPUs makes a missing device node a prepare error, as the plugin
	// does with --discovery=nvml.
	RealGPUs bool
	// MPSDaemon starts the MPS control daemons (mps.NewHostDaemon
	// on a GPU host).
	MPSDaemon mps.Daemon
	// Stat stats device nodes; nil is os.Stat.
	Stat func(string) (os.FileInfo, error)
	// BaseSpec makes the plugin write the node's base CDI spec (driver
	// libraries, binaries, firmware, nvidia-cdi-hook hooks) from the
	// host's driver with nvcdi, as the kubelet plugin does on a GPU node;
	// nil: claims get only their own device (dry run).
	BaseSpec *kubeletplugin.BaseSpecOptions
	// DriverRoot is the driver install the base spec is built from; empty
	// is "/" (the host's).
	DriverRoot string
	// MIGOnDemand is the plugin's --mig-on-demand: the GPUs in MIG mode
	// whose instances prepare creates and unprepare destroys, through
	// NVML (the discoverer's library).
	MIGOnDemand string
}

// PluginPreparer drives the kubelet plugin's own prepare code
// (kubeletplugin.Driver.PrepareResourceClaims) without a kubelet.
type PluginPreparer struct {
	drv    *kubeletplugin.Driver
	cdiDir string
}

// NewPluginPreparer builds the plugin as gpulink-kubeletplugin does, with
// its state under o.WorkDir.
func NewPluginPreparer(ctx context.Context, o PluginPreparerOptions) (*PluginPreparer, error) {
	if o.WorkDir == "" || o.NodeName == "" || o.Discoverer == nil || o.MPSDaemon == nil {
		return nil, errors.New("plugin preparer: work dir, node name, discoverer and MPS daemon are required")
	}
	cdiDir := filepath.Join(o.WorkDir, "cdi")
	cdi, err := kubeletplugin.NewCDIDir(cdiDir)
	if err != nil {
		return nil, err
	}
	drv, err := kubeletplugin.New(ctx, kubeletplugin.Options{
		NodeName:           o.NodeName,
		PluginDataDir:      filepath.Join(o.WorkDir, "plugin"),
		DriverRoot:         cmp.Or(o.DriverRoot, "/"),
		BaseSpec:           o.BaseSpec,
		RequireDriver:      o.RealGPUs,
		RequireDeviceNodes: o.RealGPUs,
		DefaultShareMemory: resource.MustParse("4Gi"),
		DefaultShareCores:  25,
		MIGOnDemand:        o.MIGOnDemand,
	}, kubeletplugin.Dependencies{
		Discoverer: o.Discoverer,
		CDI:        cdi,
		MPS:        mps.NewManager(filepath.Join(o.WorkDir, "mps"), o.MPSDaemon),
		BootID:     kubeletplugin.FileBootID("/proc/sys/kernel/random/boot_id"),
		Stat:       o.Stat,
		MIG:        kubeletplugin.MIGInstancesFor(o.Discoverer),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the kubelet plugin's prepare code: %w", err)
	}
	return &PluginPreparer{drv: drv, cdiDir: cdiDir}, nil
}

// Prepare implements Preparer.
func (p *PluginPreparer) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]string, error) {
	res, err := p.drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		return nil, fmt.Errorf("preparing claim %s: %w", claim.Name, err)
	}
	r, ok := res[claim.UID]
	if !ok {
		return nil, fmt.Errorf("preparing claim %s: the plugin returned no result for it", claim.Name)
	}
	if r.Err != nil {
		return nil, r.Err
	}
	return cdiIDs(r.Devices), nil
}

// cdiIDs lists the distinct CDI device IDs of a prepare result in order.
func cdiIDs(devs []draplugin.Device) []string {
	var ids []string
	seen := map[string]bool{}
	for _, d := range devs {
		for _, id := range d.CDIDeviceIDs {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// Unprepare implements Preparer.
func (p *PluginPreparer) Unprepare(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	res, err := p.drv.UnprepareResourceClaims(ctx, []draplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name},
		UID:            claim.UID,
	}})
	if err != nil {
		return fmt.Errorf("unpreparing claim %s: %w", claim.Name, err)
	}
	return res[claim.UID]
}

// SpecDirs implements Preparer.
func (p *PluginPreparer) SpecDirs() []string { return []string{p.cdiDir} }

// Claim namespace and request names of the suite's claims.
const (
	claimNamespace = "gpucheck"
	requestName    = "gpu"
)

// WholeClaim is an allocated claim for the whole GPU with the given index,
// as the controller writes it.
func WholeClaim(node string, index int) *resourceapi.ResourceClaim {
	return allocatedClaim("whole-gpu", resourceapi.DeviceRequestAllocationResult{
		Request: requestName, Driver: driver.Name, Pool: node, Device: driver.DeviceName(index),
	})
}

// ShareClaim is an allocated claim for a share of memoryBytes and cores
// percent of the GPU's SMs; with no opaque config the plugin applies the
// default sharing strategy (MPS).
func ShareClaim(node string, index int, memoryBytes, cores int64) *resourceapi.ResourceClaim {
	return allocatedClaim("share", shareResult(node, index, 0, memoryBytes, cores))
}

// ShareClaimTwoGPUs is a claim with an MPS share of the same size on each
// of two GPUs (HAMi's nvidia.com/gpu: 2 + gpumem, as translated): one MPS
// control daemon serves both.
func ShareClaimTwoGPUs(node string, a, b int, memoryBytes, cores int64) *resourceapi.ResourceClaim {
	return allocatedClaim("share-two", shareResult(node, a, 0, memoryBytes, cores), shareResult(node, b, 1, memoryBytes, cores))
}

// ShareSpec is one MPS share claim of the throughput, priority and daemon
// checks.
type ShareSpec struct {
	// Name makes the claim's name and UID (gpucheck-<Name>) and its
	// share ID; unique among the claims prepared at one time.
	Name        string
	GPU         int
	MemoryBytes int64
	Cores       int64
	// Concurrent puts the share in its namespace's Concurrent MPS group,
	// as a DeviceClass with sharing.mpsMode Concurrent does (the chart's
	// gpu-share-concurrent.gpulink.dev): the allocator copies the class's
	// configuration into the claim (FromClass).
	Concurrent bool
	// Priority is the claim's sharing.priority (nil: unset).
	Priority *int
}

// ShareClaimOf is an allocated claim for one MPS share as the controller
// writes it, with the class and claim configuration of the spec.
func ShareClaimOf(node string, s ShareSpec) *resourceapi.ResourceClaim {
	r := shareResult(node, s.GPU, 0, s.MemoryBytes, s.Cores)
	// A share ID of its own: the claims of one GPU never share one.
	id := types.UID(fmt.Sprintf("0f0f0f0f-0000-4000-8000-%012x", crc32.ChecksumIEEE([]byte(s.Name))))
	r.ShareID = &id
	c := allocatedClaim(s.Name, r)
	if s.Concurrent {
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, gpuConfigEntry(resourceapi.AllocationConfigSourceClass,
			fmt.Sprintf(`{"strategy":%q,"mpsMode":%q}`, apiv1alpha1.SharingMPS, apiv1alpha1.MPSConcurrent)))
	}
	if s.Priority != nil {
		c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, gpuConfigEntry(resourceapi.AllocationConfigSourceClaim,
			fmt.Sprintf(`{"priority":%d}`, *s.Priority)))
	}
	return c
}

// gpuConfigEntry is an opaque configuration entry of this driver with the
// given sharing configuration.
func gpuConfigEntry(source resourceapi.AllocationConfigSource, sharing string) resourceapi.DeviceAllocationConfiguration {
	raw := fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"sharing":%s}`, apiv1alpha1.APIVersion, apiv1alpha1.Kind, sharing)
	return resourceapi.DeviceAllocationConfiguration{
		Source: source,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(raw)},
		}},
	}
}

// shareResult is the n-th share result of a claim, with its own share ID.
func shareResult(node string, index, n int, memoryBytes, cores int64) resourceapi.DeviceRequestAllocationResult {
	shareID := types.UID(fmt.Sprintf("0f0f0f0f-0000-4000-8000-%012x", 0xbeef+n))
	return resourceapi.DeviceRequestAllocationResult{
		Request: requestName, Driver: driver.Name, Pool: node, Device: driver.DeviceName(index),
		ShareID: &shareID,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			driver.CapacityMemory: *resource.NewQuantity(memoryBytes, resource.BinarySI),
			driver.CapacityCores:  *resource.NewQuantity(cores, resource.DecimalSI),
		},
	}
}

func allocatedClaim(name string, rs ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: claimNamespace, Name: name, UID: types.UID("gpucheck-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: rs},
		}},
	}
}
