// Command gpulink-kubeletplugin is gpulink's DRA kubelet plugin: it
// publishes the node's GPUs as ResourceSlices and prepares the claims
// allocated to them. See package kubeletplugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/health"
	"github.com/gpulink/gpulink/internal/kubeclient"
	"github.com/gpulink/gpulink/internal/serve"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

type flags struct {
	nodeName            string
	migOnDemand         string
	kubeconfig          string
	kubeAPIContentType  string
	discovery           kubeletplugin.DiscoveryOptions
	gpuMemory           string
	cdiRoot             string
	registrarDir        string
	pluginDir           string
	managedByController bool
	mpsRoot             string
	mpsDaemonImage      string
	mpsDaemonNamespace  string
	mpsDevicePlugin     bool
	devicePluginDir     string
	driverRoot          string
	driverRootMount     string
	cdiHookPath         string
	cdiHookSource       string
	cdiDisableHooks     string
	cdiDriverFiles      bool
	defaultShareMemory  string
	defaultShareCores   int64
	metricsAddress      string
	podMetrics          bool
	profiling           bool
	bootIDFile          string
	rediscoverInterval  time.Duration
	mpsLimitInterval    time.Duration
	health              bool
	healthFatalXIDs     string
	healthIgnoredXIDs   string
	healthTaintEffect   string
	healthEventsFile    string
	healthPollInterval  time.Duration
	rollingUpdateUID    string
	readyFile           string
	checkReady          bool
}

func parseFlags(args []string) (*flags, error) {
	fs := flag.NewFlagSet("gpulink-kubeletplugin", flag.ContinueOnError)
	f := &flags{}
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (default: $NODE_NAME).")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty uses the in-cluster configuration.")
	fs.StringVar(&f.kubeAPIContentType, "kube-api-content-type", kubeclient.DefaultContentType, "Encoding of the requests to the API server and of its answers and watch events: application/vnd.kubernetes.protobuf (as the kubelet) or application/json.")
	fs.StringVar(&f.discovery.Backend, "discovery", kubeletplugin.DiscoveryNVML, "GPU discovery backend: nvml, mock or topology-file.")
	fs.StringVar(&f.discovery.MockServer, "mock-server", "dgxa100", "Simulated server of --discovery=mock (dgxa100, dgxh100, dgxh200, dgxb200).")
	fs.StringVar(&f.discovery.MockMIG, "mock-mig", "", `GPUs of --discovery=mock in MIG mode and their instances, GPUs separated by ";", e.g. "0:1g.5gb,3g.20gb;1:7g.40gb"; "<index>:" is MIG mode without instances, for --mig-on-demand (simulated MIG nodes; empty: none).`)
	fs.StringVar(&f.migOnDemand, "mig-on-demand", "", `GPUs in MIG mode to partition on demand: "all", or GPU indexes and UUIDs separated by commas (empty: none). Such a GPU is published as every MIG profile at every placement (partitions sharing the GPU's counters); preparing a claim creates its instance, unpreparing destroys it. gpulink never changes MIG mode. See docs/mig.md.`)
	fs.StringVar(&f.discovery.TopologyFile, "topology-file", "", "nvidia-smi topo -m output used by --discovery=topology-file.")
	fs.StringVar(&f.discovery.GPUProduct, "gpu-product", "NVIDIA A100-SXM4-40GB", "Product name of the GPUs of --discovery=topology-file.")
	fs.StringVar(&f.gpuMemory, "gpu-memory", "40Gi", "Memory of each GPU of --discovery=topology-file.")
	fs.StringVar(&f.discovery.CUDAComputeCapability, "gpu-compute-capability", "", "CUDA compute capability (e.g. 8.0) of the GPUs of --discovery=topology-file.")
	fs.StringVar(&f.discovery.Architecture, "gpu-architecture", "", "Architecture (e.g. ampere) of the GPUs of --discovery=topology-file; derived from the compute capability when empty.")
	fs.StringVar(&f.discovery.DriverVersion, "gpu-driver-version", "", "Driver version of the GPUs of --discovery=topology-file.")
	fs.StringVar(&f.cdiRoot, "cdi-root", "/var/run/cdi", "Directory the CDI specs are written to.")
	fs.StringVar(&f.registrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "Kubelet plugin registration directory.")
	fs.StringVar(&f.pluginDir, "kubelet-plugin-dir", "/var/lib/kubelet/plugins/"+driver.Name, "Plugin data directory: DRA socket and checkpoint.")
	fs.BoolVar(&f.managedByController, "managed-by-controller", true, "Taint every device "+driver.ManagedTaintKey+"=true:NoSchedule so only the gpulink controller allocates them.")
	fs.StringVar(&f.mpsRoot, "mps-root", "/run/gpulink/mps", "Directory of the MPS control daemons' pipe and log directories.")
	fs.StringVar(&f.mpsDaemonImage, "mps-daemon-image", "", "Image of the per-claim MPS control daemon pods (the plugin's own image; the daemon binary comes from the driver root). Required for MPS sharing on real GPUs.")
	fs.StringVar(&f.mpsDaemonNamespace, "mps-daemon-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the MPS control daemon pods (default: $POD_NAMESPACE, the plugin's own).")
	fs.BoolVar(&f.mpsDevicePlugin, "mps-device-plugin", false, "Serve the kubelet device plugin that gives MPS control daemon pods their GPUs' device nodes (resources "+mps.DaemonResourceDomain+"/gpu-<index>) also with simulated GPUs, for tests. With --discovery=nvml it is always served when MPS daemon pods can run: their pods ask for those resources.")
	fs.StringVar(&f.devicePluginDir, "kubelet-device-plugin-dir", mps.KubeletDevicePluginDir, "The kubelet's device plugin directory (kubelet.sock), where the MPS daemon device plugin registers. The kubelet keeps it at this path whatever its --root-dir.")
	fs.StringVar(&f.driverRoot, "driver-root", "/", "Root of the NVIDIA driver installation on the host (host paths in CDI specs are under it; device nodes only when it has a dev directory).")
	fs.StringVar(&f.driverRootMount, "driver-root-mount", "", "Where --driver-root is visible to this process (e.g. /driver-root in a container); libnvidia-ml is loaded from there. Default: --driver-root.")
	fs.StringVar(&f.cdiHookPath, "cdi-hook-path", "", "Host path of nvidia-cdi-hook written into the CDI hooks. Empty: --cdi-hook-source is copied to <kubelet-plugin-dir>/bin/nvidia-cdi-hook at start and that path is used.")
	fs.StringVar(&f.cdiHookSource, "cdi-hook-source", "/usr/bin/nvidia-cdi-hook", "nvidia-cdi-hook binary to install when --cdi-hook-path is empty (the copy shipped in the image).")
	fs.StringVar(&f.cdiDisableHooks, "cdi-disable-hooks", "", "Comma-separated nvidia-cdi-hook hooks to leave out of the base CDI spec, e.g. update-ldcache for images without ldconfig.")
	fs.BoolVar(&f.cdiDriverFiles, "cdi-driver-files", true, "Put the driver's libraries, binaries, firmware and hooks found under --driver-root into a base CDI spec (nvcdi). Required to succeed with --discovery=nvml; with mock or topology-file discovery a root without a driver only logs.")
	fs.StringVar(&f.defaultShareMemory, "default-share-memory", "4Gi", "Memory a share gets when its request does not ask (request policy default).")
	fs.Int64Var(&f.defaultShareCores, "default-share-cores", 25, "Percent of SMs a share gets when its request does not ask (request policy default).")
	fs.StringVar(&f.metricsAddress, "metrics-address", ":8080", "Address of the Prometheus /metrics endpoint; empty disables it.")
	fs.StringVar(&f.rollingUpdateUID, "rolling-update-uid", os.Getenv("POD_UID"), "UID of this plugin's pod (default: $POD_UID). Set, a new plugin pod registers with the kubelet beside the old one during a DaemonSet rolling update with maxSurge, under a socket name of its own, and both share the plugin directory under a file lock; empty: one plugin instance per node at a time.")
	fs.StringVar(&f.readyFile, "ready-file", "", "File created once the kubelet has registered the plugin, removed at start and exit; an exec readiness probe checks it (--check-ready). Unlike an HTTP probe it tells the two plugin pods of a rolling update apart when they share the node's network. Empty: none.")
	fs.BoolVar(&f.checkReady, "check-ready", false, "Do not run the plugin: exit 0 if --ready-file exists (the plugin that writes it is registered with the kubelet), else 1. The readiness probe's command.")
	fs.BoolVar(&f.podMetrics, "pod-metrics", false, "Export "+kubeletplugin.PreparedGPUInfoName+", which names the namespace, pod and claim of every prepared claim on the node, on --metrics-address. Off by default: the port has no authentication, so turn it on only where a NetworkPolicy keeps the port to the metrics scraper.")
	fs.BoolVar(&f.profiling, "profiling", false, "Serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ on --metrics-address.")
	fs.StringVar(&f.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "File holding the node's boot ID; a change invalidates the checkpoint.")
	fs.DurationVar(&f.rediscoverInterval, "rediscover-interval", time.Minute, "How often GPU discovery runs again; 0 disables.")
	fs.DurationVar(&f.mpsLimitInterval, "mps-limit-interval", 30*time.Second, "How often each MPS control daemon's limits are set again, undoing a change a claim's container made through its pipe directory; 0 disables.")
	fs.BoolVar(&f.health, "health", true, "Watch GPU health: taint GPUs with a fatal condition ("+driver.UnhealthyTaintKey+"), report device health to the kubelet, record Node events.")
	fs.StringVar(&f.healthFatalXIDs, "health-fatal-xids", health.FormatXIDs(health.DefaultFatalXIDs), "Comma-separated XIDs that taint a GPU (see package driver/health for why each is fatal).")
	fs.StringVar(&f.healthIgnoredXIDs, "health-ignored-xids", health.FormatXIDs(health.DefaultIgnoredXIDs), "Comma-separated XIDs caused by applications, ignored; any other XID is a warning.")
	fs.StringVar(&f.healthTaintEffect, "health-taint-effect", string(resourceapi.DeviceTaintEffectNoSchedule), "Effect of the unhealthy taint: NoSchedule (no new claims) or NoExecute (also evicts the pods using the GPU).")
	fs.StringVar(&f.healthEventsFile, "health-events-file", "", "File of injected health events, one JSON object a line, read as it grows (tests, and operator clears: {\"device\":\"gpu-1\",\"kind\":\"recovered\"}). Default: <kubelet-plugin-dir>/health-events.jsonl.")
	fs.DurationVar(&f.healthPollInterval, "health-poll-interval", 10*time.Second, "How often NVML is polled for lost GPUs, row remap failures and thermal slowdown.")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	f.discovery.NodeName = f.nodeName
	if f.healthEventsFile == "" {
		f.healthEventsFile = filepath.Join(f.pluginDir, "health-events.jsonl")
	}
	return f, nil
}

// healthOptions turns the --health* flags into the plugin's options; nil
// when health handling is off.
func (f *flags) healthOptions() (*kubeletplugin.HealthOptions, error) {
	if !f.health {
		return nil, nil
	}
	fatal, err := health.ParseXIDs("--health-fatal-xids", f.healthFatalXIDs)
	if err != nil {
		return nil, err
	}
	ignored, err := health.ParseXIDs("--health-ignored-xids", f.healthIgnoredXIDs)
	if err != nil {
		return nil, err
	}
	p := health.Policy{FatalXIDs: fatal, IgnoredXIDs: ignored}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("--health-fatal-xids and --health-ignored-xids: %w", err)
	}
	effect := resourceapi.DeviceTaintEffect(f.healthTaintEffect)
	if effect != resourceapi.DeviceTaintEffectNoSchedule && effect != resourceapi.DeviceTaintEffectNoExecute {
		return nil, fmt.Errorf("--health-taint-effect: %q, want NoSchedule or NoExecute", f.healthTaintEffect)
	}
	if f.healthPollInterval <= 0 {
		return nil, fmt.Errorf("--health-poll-interval: %s must be positive", f.healthPollInterval)
	}
	return &kubeletplugin.HealthOptions{Policy: p, TaintEffect: effect}, nil
}

// metricsHandler serves the metrics port: /metrics, /healthz, /readyz
// and, with --profiling, Go's runtime profiles under /debug/pprof/.
func metricsHandler(reg *prometheus.Registry, healthErr func() error, registered func() bool, profiling bool) http.Handler {
	mux := serve.Metrics(reg, profiling)
	// Readiness: the kubelet has registered this instance. With
	// hostNetwork, two instances of a rolling update serve this port
	// together and either may answer; the chart's probe is --check-ready.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !registered() {
			http.Error(w, "not registered with the kubelet yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	// Liveness: fails while a health source cannot read the GPUs (NVML
	// broken), so the plugin restarts instead of showing them healthy.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := healthErr(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if f.checkReady {
		if err := kubeletplugin.CheckReadyFile(f.readyFile); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if err := runUntilSignalled(f); err != nil {
		klog.ErrorS(err, "gpulink-kubeletplugin failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// runUntilSignalled runs the plugin until SIGINT or SIGTERM. It is a
// function of its own so that the signal handler is released by a deferred
// call that runs, which it would not in main before os.Exit.
func runUntilSignalled(f *flags) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return run(ctx, f)
}

func run(ctx context.Context, f *flags) error {
	logger := klog.Background().WithName("gpulink-kubeletplugin")
	ctx = klog.NewContext(ctx, logger)

	if f.nodeName == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	var err error
	if f.discovery.GPUMemory, err = resource.ParseQuantity(f.gpuMemory); err != nil {
		return fmt.Errorf("--gpu-memory: %w", err)
	}
	shareMem, err := resource.ParseQuantity(f.defaultShareMemory)
	if err != nil {
		return fmt.Errorf("--default-share-memory: %w", err)
	}
	if shareMem.Sign() <= 0 {
		return fmt.Errorf("--default-share-memory: %s must be positive", f.defaultShareMemory)
	}
	if f.defaultShareCores < 1 || f.defaultShareCores > 100 {
		return fmt.Errorf("--default-share-cores: %d must be between 1 and 100", f.defaultShareCores)
	}

	var cfg *rest.Config
	if f.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("loading the Kubernetes client configuration: %w", err)
	}
	if err := kubeclient.SetContentType(cfg, f.kubeAPIContentType); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}

	f.discovery.DriverRoot = f.driverRoot
	if f.driverRootMount != "" {
		f.discovery.DriverRoot = f.driverRootMount
	}
	discoverer, err := kubeletplugin.NewDiscoverer(f.discovery)
	if err != nil {
		return err
	}
	cdi, err := kubeletplugin.NewCDIDir(f.cdiRoot)
	if err != nil {
		return err
	}
	var baseSpec *kubeletplugin.BaseSpecOptions
	hook := f.cdiHookPath
	if f.cdiDriverFiles && hook == "" {
		hook, err = kubeletplugin.InstallCDIHook(f.cdiHookSource, filepath.Join(f.pluginDir, "bin"))
		if err != nil && f.discovery.RealGPUs() {
			return err
		}
		if err != nil {
			// Simulated GPUs: driver files are optional, and so is the hook.
			logger.Info("No nvidia-cdi-hook to install, CDI specs carry no driver files", "reason", err.Error())
		}
	}
	if f.cdiDriverFiles && hook != "" {
		baseSpec = &kubeletplugin.BaseSpecOptions{HookPath: hook}
		if f.cdiDisableHooks != "" {
			baseSpec.DisabledHooks = strings.Split(f.cdiDisableHooks, ",")
		}
		if f.discovery.RealGPUs() {
			// The driver version comes from the same NVML as discovery.
			if baseSpec.NVML, err = kubeletplugin.NVMLLibrary(f.discovery.DriverRoot); err != nil {
				return err
			}
		}
	}
	var uvm *kubeletplugin.UVMNodeCreator
	if f.discovery.RealGPUs() {
		uvm = kubeletplugin.NewUVMNodeCreator()
	}
	var daemon mps.Daemon = mps.DirOnlyDaemon{}
	// The daemon pods ask for the MPS daemon device plugin's resources, so
	// it is served wherever they run; tests turn it on with simulated GPUs.
	devicePlugin := f.mpsDevicePlugin
	if f.discovery.RealGPUs() {
		pd, err := mps.NewPodDaemon(mps.PodDaemonConfig{
			Pods:            client.CoreV1(),
			Nodes:           client.CoreV1(),
			Namespace:       f.mpsDaemonNamespace,
			Image:           f.mpsDaemonImage,
			NodeName:        f.nodeName,
			DriverRoot:      f.driverRoot,
			DriverRootMount: f.discovery.DriverRoot,
		})
		if err != nil {
			// Whole GPUs and other sharing strategies still work; MPS
			// claims fail with this error.
			logger.Error(err, "MPS sharing is unavailable on this node")
			daemon = mps.UnavailableDaemon{Err: err}
		} else {
			daemon = pd
			devicePlugin = true
		}
	}

	healthOpts, err := f.healthOptions()
	if err != nil {
		return err
	}
	var healthSources []kubeletplugin.HealthSource
	var recorder events.EventRecorder
	if healthOpts != nil {
		healthSources = append(healthSources, &kubeletplugin.FileHealthSource{Path: f.healthEventsFile})
		if f.discovery.RealGPUs() {
			lib, err := kubeletplugin.NVMLLibrary(f.discovery.DriverRoot)
			if err != nil {
				return err
			}
			healthSources = append(healthSources, &kubeletplugin.NVMLHealthSource{Lib: lib, PollInterval: f.healthPollInterval})
		}
		b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
		b.StartRecordingToSink(ctx.Done())
		defer b.Shutdown()
		recorder = b.NewRecorder(scheme.Scheme, "gpulink-kubeletplugin")
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := kubeletplugin.NewNodeMetrics(reg, kubeletplugin.NodeMetricsOptions{Node: f.nodeName, PodMetrics: f.podMetrics})

	d, err := kubeletplugin.New(ctx, kubeletplugin.Options{
		NodeName:            f.nodeName,
		PluginDataDir:       f.pluginDir,
		RegistrarDir:        f.registrarDir,
		DriverRoot:          f.driverRoot,
		DriverRootMount:     f.driverRootMount,
		BaseSpec:            baseSpec,
		RequireDriver:       f.discovery.RealGPUs(),
		RequireDeviceNodes:  f.discovery.RealGPUs(),
		ManagedByController: f.managedByController,
		DefaultShareMemory:  shareMem,
		DefaultShareCores:   f.defaultShareCores,
		RediscoverInterval:  f.rediscoverInterval,
		MPSLimitInterval:    f.mpsLimitInterval,
		PCIeRootFromSysfs:   f.discovery.RealGPUs(),
		Health:              healthOpts,
		RollingUpdateUID:    types.UID(f.rollingUpdateUID),
		ReadyFile:           f.readyFile,
		MIGOnDemand:         f.migOnDemand,
	}, kubeletplugin.Dependencies{
		Discoverer: discoverer,
		CDI:        cdi,
		MPS:        mps.NewManager(f.mpsRoot, daemon),
		BootID:     kubeletplugin.FileBootID(f.bootIDFile),
		UVM:        uvm,
		Metrics:    metrics,

		HealthSources: healthSources,
		Events:        recorder,
		MIG:           kubeletplugin.MIGInstancesFor(discoverer),
	})
	if err != nil {
		return err
	}

	if f.metricsAddress != "" {
		// SO_REUSEPORT: during a rolling update the new plugin pod serves
		// the port beside the old one when both use the node's network.
		go func() {
			if err := serve.Serve(ctx, f.metricsAddress, metricsHandler(reg, d.HealthError, d.Registered, f.profiling), serve.Options{Name: "metrics", ReusePort: true}); err != nil {
				logger.Error(err, "Metrics server failed", "address", f.metricsAddress)
			}
		}()
	}
	if devicePlugin {
		dp, err := mps.NewDevicePlugin(mps.DevicePluginConfig{
			Dir:      f.devicePluginDir,
			GPUs:     d.GPUs,
			DevRoots: kubeletplugin.DriverRoot{Host: f.driverRoot, Mount: f.driverRootMount}.DevRoots,
		})
		if err != nil {
			return err
		}
		dpCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := dp.Run(dpCtx); err != nil {
				logger.Error(err, "MPS daemon device plugin stopped; MPS daemon pods cannot start on this node")
			}
		}()
		// Stopped after the DRA plugin, removing its sockets.
		defer func() { cancel(); <-done }()
	}
	logger.Info("Starting", "node", f.nodeName, "discovery", f.discovery.Backend, "cdiRoot", f.cdiRoot, "pluginDir", f.pluginDir, "managedByController", f.managedByController)
	return d.Run(ctx, client)
}
