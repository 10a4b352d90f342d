package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// Options configure the plugin.
type Options struct {
	// NodeName is this node; it names the pool, too.
	NodeName string
	// PluginDataDir holds the DRA socket and the checkpoint.
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registration directory.
	RegistrarDir string
	// DriverRoot is the host path of the NVIDIA driver root; CDI host
	// paths are under it (device nodes only when it has a dev directory).
	DriverRoot string
	// DriverRootMount is where this process sees DriverRoot; empty: the
	// same path.
	DriverRootMount string
	// BaseSpec, when set, makes New generate the node's base CDI spec
	// (driver files and hooks) from the driver root with nvcdi; Root is
	// taken from DriverRoot and DriverRootMount.
	BaseSpec *BaseSpecOptions
	// RequireDriver makes a driver root without a usable driver an error
	// of New (real GPUs). Otherwise the plugin logs it and runs without a
	// base spec (simulated GPUs on GPU-less nodes).
	RequireDriver bool
	// RequireDeviceNodes makes a missing /dev/nvidia* node a prepare
	// error (real GPUs); otherwise missing nodes are left out and logged.
	RequireDeviceNodes bool
	// ManagedByController taints every device so only the gpulink
	// controller allocates it.
	ManagedByController bool
	// DefaultShareMemory and DefaultShareCores are the request policy
	// defaults, and the share size when an allocation does not say.
	DefaultShareMemory resource.Quantity
	DefaultShareCores  int64
	// RediscoverInterval is how often discovery runs again (0: never).
	RediscoverInterval time.Duration
	// MPSLimitInterval is how often the MPS daemons' limits are set again,
	// undoing what a claim's container may have changed (0: never).
	MPSLimitInterval time.Duration
	// PCIeRootFromSysfs looks up the PCIe root of GPUs whose discovery
	// did not report one in this host's sysfs (real GPUs only).
	PCIeRootFromSysfs bool
	// Health turns on device health handling (taints, kubelet health
	// reports); nil: off.
	Health *HealthOptions
	// MIGOnDemand names the GPUs in MIG mode to partition on demand
	// (ondemand.go): "all", or GPU indexes and UUIDs separated by commas;
	// empty: none.
	MIGOnDemand string
	// RollingUpdateUID, the plugin pod's UID, lets a new instance run
	// beside the old one during a DaemonSet rolling update (rolling.go);
	// empty: one instance at a time.
	RollingUpdateUID types.UID
	// ReadyFile, when set, is created once the kubelet has registered the
	// plugin and removed when Run starts and ends (registration.go); an
	// exec readiness probe checks it.
	ReadyFile string
}

// Dependencies are the seams tests replace.
type Dependencies struct {
	Discoverer discovery.Discoverer
	CDI        CDIWriter
	MPS        mps.Manager
	BootID     BootIDReader
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Metrics defaults to unregistered metrics.
	Metrics *Metrics
	// Stat stats host paths (device nodes); defaults to os.Stat.
	Stat func(path string) (os.FileInfo, error)
	// UVM creates missing /dev/nvidia-uvm* nodes when device nodes are
	// required; nil: a missing one fails the claim.
	UVM *UVMNodeCreator
	// HealthSources report GPU events when Options.Health is set.
	HealthSources []HealthSource
	// Events records health changes on the Node; nil: not recorded.
	Events events.EventRecorder
	// MIG creates and destroys the MIG instances of GPUs partitioned on
	// demand; required when Options.MIGOnDemand names any.
	MIG MIGInstanceManager
}

// Publisher publishes ResourceSlices; *draplugin.Helper is one.
type Publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Driver is gpulink's DRA kubelet plugin.
type Driver struct {
	opts       Options
	discoverer discovery.Discoverer
	cdi        CDIWriter
	mps        mps.Manager
	bootID     BootIDReader
	clock      clock.WithTicker
	metrics    *Metrics
	stat       func(string) (os.FileInfo, error)
	uvm        *UVMNodeCreator
	ckpt       *CheckpointStore
	// baseID is the base CDI device every claim gets; empty: none.
	baseID string

	// migSelection are the GPUs --mig-on-demand names, migInstances
	// creates their instances, migRefused are those not partitioned on
	// demand because they hold instances gpulink did not create (UUID to
	// the instances), fixed at start (ondemand.go).
	migSelection migOnDemandSelection
	migInstances MIGInstanceManager
	migRefused   map[string]string
	// migWithheld are GPUs named by --mig-on-demand whose instances'
	// owners were lost with the checkpoint: published without devices
	// (UUID to the instances; Checkpoint.WithheldGPUs, ondemand.go).
	migWithheld map[string]string
	// stateLost: this start found the checkpoint corrupt.
	stateLost bool

	// health is nil when health handling is off.
	health        *healthMonitor
	healthSources []HealthSource
	// republish asks RunPublisher for a publication (health changed).
	republish chan struct{}

	// fatal ends Run; set by Run.
	fatalMu sync.Mutex
	fatal   context.CancelCauseFunc

	mu        sync.Mutex
	topo      *topology.Topology
	resources *resourceslice.DriverResources
	cp        *Checkpoint
	// dirty means cp has changes not yet in the checkpoint file.
	dirty bool
	// rolling shares the plugin directory with another instance.
	rolling rollingState
	// registration is what the kubelet said about this instance.
	registration registrationState
	// onDemandChanged: recovery changed the GPUs partitioned on demand
	// or their instances (ondemand.go), so New discovers again.
	onDemandChanged bool
}

var _ draplugin.DRAPlugin = (*Driver)(nil)

// New discovers the GPUs, builds the ResourceSlices (failing on any API
// limit violation) and recovers the prepared claims from the checkpoint.
// It starts nothing; Run does.
func New(ctx context.Context, opts Options, deps Dependencies) (*Driver, error) {
	logger := klog.FromContext(ctx)
	switch {
	case opts.NodeName == "":
		return nil, errors.New("node name is empty (--node-name or NODE_NAME)")
	case opts.PluginDataDir == "":
		return nil, errors.New("plugin data directory is empty")
	case deps.Discoverer == nil || deps.CDI == nil || deps.MPS == nil || deps.BootID == nil:
		return nil, errors.New("discoverer, CDI writer, MPS manager and boot ID reader are required")
	}
	if opts.DriverRoot == "" {
		opts.DriverRoot = "/"
	}
	migSelection, err := parseMIGOnDemand(opts.MIGOnDemand)
	if err != nil {
		return nil, err
	}
	if !migSelection.empty() && deps.MIG == nil {
		return nil, fmt.Errorf("--mig-on-demand=%q needs a discovery backend that can create MIG instances (nvml or mock)", opts.MIGOnDemand)
	}
	d := &Driver{
		opts:       opts,
		discoverer: deps.Discoverer,
		cdi:        deps.CDI,
		mps:        deps.MPS,
		bootID:     deps.BootID,
		clock:      deps.Clock,
		metrics:    deps.Metrics,
		stat:       deps.Stat,
		uvm:        deps.UVM,
		ckpt:       NewCheckpointStore(opts.PluginDataDir),
		republish:  make(chan struct{}, 1),

		migSelection: migSelection,
		migInstances: deps.MIG,
		migRefused:   map[string]string{},
		migWithheld:  map[string]string{},

		healthSources: deps.HealthSources,
	}
	if d.clock == nil {
		d.clock = clock.RealClock{}
	}
	if d.metrics == nil {
		d.metrics = NewMetrics(nil)
	}
	if d.stat == nil {
		d.stat = os.Stat
	}
	if err := os.MkdirAll(opts.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("creating plugin data directory: %w", err)
	}
	if err := d.setupBaseSpec(logger); err != nil {
		return nil, err
	}
	t, res, err := d.discover(ctx)
	if err != nil {
		return nil, err
	}
	d.topo, d.resources = t, &res
	logger.Info("Discovered GPUs", "node", opts.NodeName, "gpus", t.Len())
	// Under the checkpoint lock: an older instance may still be serving
	// (rolling.go).
	if err := d.openStateLock(); err != nil {
		return nil, err
	}
	if err := flock(ctx, d.rolling.lock); err != nil {
		return nil, err
	}
	err = d.recoverState(ctx)
	funlock(d.rolling.lock)
	if err != nil {
		return nil, err
	}
	if d.onDemandChanged || d.cp.holdsPartitions() {
		// Recovery refused a GPU or destroyed orphaned instances, or
		// prepared partitions' instances must not be published as
		// static MIG devices (withholdClaimedInstances): publish what
		// the node has now, knowing the checkpoint.
		if d.topo, res, err = d.discover(ctx); err != nil {
			return nil, err
		}
		d.resources = &res
	}
	if err := d.setupHealth(logger, opts.Health, deps.Events); err != nil {
		return nil, err
	}
	return d, nil
}

// Run registers the plugin with the kubelet, publishes the node's
// ResourceSlices, rediscovers periodically until ctx ends or a fatal
// background error occurs, and then stops the helper. extra options are
// appended to the helper's (tests use them).
func (d *Driver) Run(ctx context.Context, kubeClient kubernetes.Interface, extra ...draplugin.Option) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	d.fatalMu.Lock()
	d.fatal = cancel
	d.fatalMu.Unlock()

	if err := d.resetRegistration(); err != nil {
		return err
	}
	defer d.unregistered(ctx)
	opts := []draplugin.Option{
		draplugin.GRPCInterceptor(d.watchRegistration),
		draplugin.DriverName(driver.Name),
		draplugin.KubeClient(kubeClient),
		draplugin.NodeName(d.opts.NodeName),
		draplugin.PluginDataDirectoryPath(d.opts.PluginDataDir),
		draplugin.Serialize(true),
	}
	if d.opts.RollingUpdateUID != "" {
		if err := checkRegistrarSocket(d.opts.RegistrarDir, d.opts.RollingUpdateUID); err != nil {
			return err
		}
		opts = append(opts, draplugin.RollingUpdate(d.opts.RollingUpdateUID))
	}
	if d.opts.RegistrarDir != "" {
		// kubelet creates its registry on start; creating it here too lets
		// the plugin start first, and lets API-only test nodes (no kubelet)
		// publish slices.
		if err := os.MkdirAll(d.opts.RegistrarDir, 0o750); err != nil {
			return fmt.Errorf("creating kubelet plugin registry %s: %w", d.opts.RegistrarDir, err)
		}
		opts = append(opts, draplugin.RegistrarDirectoryPath(d.opts.RegistrarDir))
	}
	helper, err := draplugin.Start(ctx, d, append(opts, extra...)...)
	if err != nil {
		return fmt.Errorf("starting kubelet plugin helper: %w", err)
	}
	defer helper.Stop()
	d.runHealthSources(ctx, d.healthSources)
	go d.runMPSLimits(ctx)
	release, err := d.holdPublisherLock(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer release()
	if err := d.RunPublisher(ctx, helper); err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// HandleError implements draplugin.DRAPlugin. Errors the helper marks
// recoverable are logged and counted, except dropped fields: when the API
// server drops the devices' taints or allowMultipleAllocations (feature
// gates off), kube-scheduler could hand out devices the controller
// manages, so the plugin stops rather than run with wrong slices. Other
// unrecoverable errors stop the plugin too.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.metrics.BackgroundErrors.Inc()
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	var dropped *resourceslice.DroppedFieldsError
	switch {
	case errors.As(err, &dropped):
		d.stop(fmt.Errorf("%s: the API server dropped fields of the ResourceSlices (disabled features: %v); refusing to run with slices that kube-scheduler would misread: %w", msg, dropped.DisabledFeatures(), err))
	case !errors.Is(err, draplugin.ErrRecoverable):
		d.stop(fmt.Errorf("%s: %w", msg, err))
	}
}

func (d *Driver) stop(err error) {
	d.fatalMu.Lock()
	defer d.fatalMu.Unlock()
	if d.fatal != nil {
		d.fatal(err)
	}
}

// store writes the checkpoint and clears dirty.
func (d *Driver) store() error {
	if err := d.ckpt.Store(d.cp); err != nil {
		return err
	}
	d.dirty = false
	d.metrics.PreparedClaims.Set(float64(len(d.cp.Claims)))
	d.metrics.PreparedGPUs.set(d.opts.NodeName, d.cp)
	if c, ok := d.mps.(interface{ Daemons() int }); ok {
		d.metrics.MPSDaemons.Set(float64(c.Daemons()))
	}
	return nil
}

// flushIfDirty retries a checkpoint write that failed earlier.
func (d *Driver) flushIfDirty(logger klog.Logger) {
	if !d.dirty {
		return
	}
	if err := d.store(); err != nil {
		logger.Error(err, "Writing checkpoint failed, will retry")
	}
}

// setupBaseSpec writes the node's base CDI spec, replacing the previous
// one, or removes a stale one when there is none to write. It runs before
// any claim is served, so a driver problem shows at plugin start rather
// than when a pod starts.
func (d *Driver) setupBaseSpec(logger klog.Logger) error {
	if d.opts.BaseSpec == nil {
		return d.cdi.RemoveBaseSpec()
	}
	o := *d.opts.BaseSpec
	o.Root = d.driverRoot()
	spec, err := BuildBaseSpec(logger, o)
	if err != nil {
		if d.opts.RequireDriver {
			return err
		}
		logger.Info("No NVIDIA driver under the driver root: CDI specs carry device nodes and environment only", "reason", err.Error())
		return d.cdi.RemoveBaseSpec()
	}
	if err := d.cdi.WriteBaseSpec(spec); err != nil {
		return err
	}
	d.baseID = CDIBaseDeviceID()
	logger.Info("Wrote base CDI spec", "device", d.baseID, "driverRoot", o.Root.Host, "hook", o.HookPath,
		"mounts", len(spec.Devices[0].ContainerEdits.Mounts), "hooks", len(spec.Devices[0].ContainerEdits.Hooks))
	return nil
}

func (d *Driver) driverRoot() DriverRoot {
	return DriverRoot{Host: d.opts.DriverRoot, Mount: d.opts.DriverRootMount}
}

func (d *Driver) cdiOptions() cdiOptions {
	return cdiOptions{
		Root:               d.driverRoot(),
		RequireDeviceNodes: d.opts.RequireDeviceNodes,
		Stat:               d.stat,
		UVM:                d.uvm,
		MPSDirs:            d.mps.Dirs,
	}
}

// GPUs returns the GPUs of the last discovery, for the MPS daemon device
// plugin (mps.DevicePluginConfig.GPUs).
func (d *Driver) GPUs() []topology.GPU {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.topo.GPUs)
}
