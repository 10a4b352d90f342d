// Command gpulink-gpucheck is gpulink's GPU acceptance suite: on a Linux
// host with an NVIDIA GPU and driver (no Kubernetes) it compares NVML
// discovery with nvidia-smi, prepares a whole-GPU and an MPS share claim
// with the kubelet plugin's prepare code, runs containers with runc from
// the CDI specs, and prints one table of checks. See internal/gpucheck and
// hack/gpu-check/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/internal/gpucheck"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

type flags struct {
	cfg         gpucheck.Config
	shareMemory string
	mockServer  string
	mockMIG     string
	keep        bool
	// daemonDriverRoot is --daemon-driver-root (the dry run makes its own).
	daemonDriverRoot string
}

func parseFlags(args []string) (*flags, error) {
	fs := flag.NewFlagSet("gpulink-gpucheck", flag.ContinueOnError)
	f := &flags{}
	fs.BoolVar(&f.cfg.DryRun, "dry-run", false, "Run only the GPU-less parts: mock discovery, prepare, CDI injection, a shell probe under runc.")
	fs.StringVar(&f.cfg.WorkDir, "work-dir", "", "Directory for CDI specs, MPS directories and bundles (default: a new temporary directory).")
	fs.BoolVar(&f.keep, "keep", false, "Keep the work directory.")
	fs.IntVar(&f.cfg.GPUIndex, "gpu", 0, "Index of the GPU the claims are for.")
	fs.StringVar(&f.shareMemory, "share-memory", "4Gi", "Memory of the MPS share claim.")
	fs.Int64Var(&f.cfg.ShareCores, "share-cores", 50, "Percent of SMs of the MPS share claim.")
	fs.StringVar(&f.cfg.Runc, "runc", defaultRunc(), "runc binary (default: the bundle's bin/runc next to this binary, else runc from PATH).")
	fs.StringVar(&f.cfg.NVIDIASMI, "nvidia-smi", "nvidia-smi", "nvidia-smi binary.")
	fs.StringVar(&f.cfg.NVCC, "nvcc", "nvcc", "CUDA compiler that builds the probe.")
	fs.DurationVar(&f.cfg.ContainerTimeout, "container-timeout", 2*time.Minute, "Time limit of each container.")
	fs.IntVar(&f.cfg.Work.Reps, "spin-reps", gpucheck.DefaultWork.Reps, "Repetitions of the throughput checks' kernel (spin_fma) in each client.")
	f.cfg.Work.Blocks, f.cfg.Work.Iters = gpucheck.DefaultWork.Blocks, gpucheck.DefaultWork.Iters
	fs.DurationVar(&f.cfg.StartLead, "start-lead", 5*time.Second, "How far ahead the clients of one throughput check are told to start their kernels together.")
	fs.StringVar(&f.daemonDriverRoot, "daemon-driver-root", "/", "Driver root (host path) the MPS daemon pod rows mount into the daemon's pod, as the chart's kubeletplugin.driverRoot; empty skips those rows.")
	fs.StringVar(&f.mockServer, "mock-server", "dgxh100", "go-nvml mock server of --dry-run.")
	fs.StringVar(&f.mockMIG, "mock-mig", "7:", `GPUs of the --dry-run mock in MIG mode and their instances, as the kubelet plugin's --mock-mig ("7:": GPU 7 in MIG mode without instances, so that the MIG rows run on the mock; empty: none).`)
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	q, err := resource.ParseQuantity(f.shareMemory)
	if err != nil || q.Value() < 1<<20 {
		return nil, fmt.Errorf("--share-memory=%s: want a quantity of at least 1Mi", f.shareMemory)
	}
	f.cfg.ShareMemoryBytes = q.Value()
	if f.cfg.ShareCores < 1 || f.cfg.ShareCores > 100 {
		return nil, fmt.Errorf("--share-cores=%d: want 1..100", f.cfg.ShareCores)
	}
	if f.cfg.Work.Reps < 1 || f.cfg.Work.Reps > 100 {
		return nil, fmt.Errorf("--spin-reps=%d: want 1..100", f.cfg.Work.Reps)
	}
	f.cfg.NodeName = "gpucheck"
	return f, nil
}

// defaultRunc prefers the runc shipped next to this binary in the bundle.
func defaultRunc() string { return bundledBinary("runc") }

// bundledBinary is name next to this binary when it is there (the
// bundle's bin directory), else name (looked up in PATH).
func bundledBinary(name string) string {
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), name); fileExists(p) {
			return p
		}
	}
	return name
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, f)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, f *flags) int {
	if !f.cfg.DryRun {
		if err := gpucheck.CheckHost(os.Stat, exec.LookPath, f.cfg.NVIDIASMI); err != nil {
			fmt.Fprintln(os.Stderr, "gpucheck:", err)
			return 2
		}
	}
	if f.cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "gpucheck-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "gpucheck: creating the work directory:", err)
			return 2
		}
		f.cfg.WorkDir = dir
		if !f.keep {
			defer os.RemoveAll(dir)
		}
	}
	deps, err := wire(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		return 2
	}
	rep := gpucheck.Run(ctx, f.cfg, deps)
	if f.cfg.DryRun {
		fmt.Println("gpulink GPU acceptance suite, DRY RUN (no GPU used)")
	} else {
		fmt.Println("gpulink GPU acceptance suite")
	}
	if err := rep.Print(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		return 1
	}
	if f.keep {
		fmt.Println("work directory kept:", f.cfg.WorkDir)
	}
	return rep.ExitCode()
}

// wire picks the real or the dry-run backends.
func wire(f *flags) (gpucheck.Deps, error) {
	popts := gpucheck.PluginPreparerOptions{WorkDir: f.cfg.WorkDir, NodeName: f.cfg.NodeName}
	if f.cfg.DryRun {
		layout, err := discovery.ParseMockMIG(f.mockMIG)
		if err != nil {
			return gpucheck.Deps{}, fmt.Errorf("--mock-mig=%q: %w", f.mockMIG, err)
		}
		d, err := discovery.NewMockWith(f.mockServer, discovery.MockOptions{MIG: layout})
		if err != nil {
			return gpucheck.Deps{}, fmt.Errorf("--mock-server=%s --mock-mig=%q: %w", f.mockServer, f.mockMIG, err)
		}
		popts.Discoverer, popts.MPSDaemon, popts.Stat = d, mps.DirOnlyDaemon{}, gpucheck.DryRunStat
		// The daemon pod rows run a stand-in for nvidia-cuda-mps-control.
		f.cfg.DaemonDriverRoot = filepath.Join(f.cfg.WorkDir, "dry-run-driver-root")
		if err := gpucheck.WriteDryRunDriverRoot(f.cfg.DaemonDriverRoot); err != nil {
			return gpucheck.Deps{}, err
		}
	} else {
		f.cfg.DaemonDriverRoot = f.daemonDriverRoot
		d, err := kubeletplugin.NewDiscoverer(kubeletplugin.DiscoveryOptions{Backend: kubeletplugin.DiscoveryNVML, DriverRoot: "/"})
		if err != nil {
			return gpucheck.Deps{}, err
		}
		daemon, err := mps.NewHostDaemon("/", nil)
		if err != nil {
			return gpucheck.Deps{}, fmt.Errorf("MPS: %w", err)
		}
		popts.Discoverer, popts.MPSDaemon, popts.RealGPUs = d, daemon, true
		// The driver's files reach the containers through the base CDI
		// spec, with the hooks run by the nvidia-cdi-hook of the bundle.
		hook, err := filepath.Abs(bundledBinary("nvidia-cdi-hook"))
		if err != nil {
			return gpucheck.Deps{}, err
		}
		if !fileExists(hook) {
			return gpucheck.Deps{}, fmt.Errorf("%s: not found; the bundle ships nvidia-cdi-hook next to gpulink-gpucheck (make gpu-check-bundle)", hook)
		}
		lib, err := kubeletplugin.NVMLLibrary("/")
		if err != nil {
			return gpucheck.Deps{}, err
		}
		popts.BaseSpec = &kubeletplugin.BaseSpecOptions{HookPath: hook, NVML: lib}
	}
	deps := gpucheck.Deps{
		Run:        gpucheck.Exec,
		Discoverer: popts.Discoverer,
		NewPreparer: func(ctx context.Context) (gpucheck.Preparer, error) {
			return gpucheck.NewPluginPreparer(ctx, popts)
		},
		// The daemon pod rows: a plugin of their own whose daemons run in
		// pods (mps.PodDaemon).
		NewPreparerWithDaemon: func(ctx context.Context, workDir string, daemon mps.Daemon) (gpucheck.Preparer, error) {
			o := popts
			o.WorkDir, o.MPSDaemon = workDir, daemon
			return gpucheck.NewPluginPreparer(ctx, o)
		},
		Stat: popts.Stat,
	}
	// The MIG rows drive a second plugin, with its own checkpoint and CDI
	// directory, that partitions the GPU they pick on demand; the
	// instances are listed through the same NVML library.
	if m, ok := discovery.MIGInstancesOf(popts.Discoverer); ok {
		deps.MIG = m
		deps.NewMIGPreparer = func(ctx context.Context, gpuIndex int) (gpucheck.Preparer, error) {
			o := popts
			o.WorkDir = filepath.Join(popts.WorkDir, "mig")
			o.MIGOnDemand = strconv.Itoa(gpuIndex)
			return gpucheck.NewPluginPreparer(ctx, o)
		}
	}
	return deps, nil
}
