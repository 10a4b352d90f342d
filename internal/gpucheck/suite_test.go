package gpucheck

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// suiteDeps wires the real plugin prepare code over a fake host's GPUs.
func suiteDeps(t *testing.T, d discovery.Discoverer, run Runner, workDir string) Deps {
	return Deps{
		Run:        run,
		Discoverer: d,
		NewPreparer: func(ctx context.Context) (Preparer, error) {
			return NewPluginPreparer(ctx, PluginPreparerOptions{
				WorkDir: workDir, NodeName: "gpucheck", Discoverer: d,
				MPSDaemon: mps.DirOnlyDaemon{}, Stat: DryRunStat,
			})
		},
		NewPreparerWithDaemon: func(ctx context.Context, dir string, daemon mps.Daemon) (Preparer, error) {
			return NewPluginPreparer(ctx, PluginPreparerOptions{
				WorkDir: dir, NodeName: "gpucheck", Discoverer: d, MPSDaemon: daemon, Stat: DryRunStat,
			})
		},
		Stat: DryRunStat,
	}
}

func gpuConfig(t *testing.T) Config {
	root := t.TempDir()
	if err := WriteDryRunDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	return Config{
		WorkDir: t.TempDir(), NodeName: "gpucheck", ShareMemoryBytes: 4 << 30, ShareCores: 50,
		Runc: "runc", NVIDIASMI: "nvidia-smi", NVCC: "nvcc",
		// The fake probe does not wait for the start time.
		StartLead: 50 * time.Millisecond, DaemonDriverRoot: root,
	}
}

func TestRunOnGPUHostWithClientSideMPSLimits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs}
	cfg := gpuConfig(t)
	rep := Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir))
	got := results(t, rep.Results)
	uuid := "GPU-6b3a1f2e-8c4d-4f5e-9a7b-1c2d3e4f5a6b"
	wantResult(t, got, CheckDiscovery, Pass, "1 GPU(s)")
	wantResult(t, got, CheckSMIGPUs, Pass, "0="+uuid)
	wantResult(t, got, CheckSMIMemory, Pass, "0=81559MiB")
	wantResult(t, got, CheckSMIBusIDs, Pass, "0=0000:19:00.0")
	wantResult(t, got, CheckTopoGPUs, Pass)
	wantResult(t, got, CheckTopoLinks, Skip, "no pair")
	wantResult(t, got, CheckProbeBuild, Pass, "gpucheck-probe")
	wantResult(t, got, CheckPrepareWhole, Pass, "gpu.gpulink.dev/claim=gpucheck-whole-gpu")
	wantResult(t, got, CheckContainerWhole, Pass, "CUDA devices ["+uuid+"], kernel ok", "/dev/nvidia0,")
	// Without a base spec (no driver files in the plugin's CDI specs) a
	// container without the host's /usr finds no libcuda: the check
	// catches it. TestBaseSpecGivesCDIOnlyContainerTheDriver is the case
	// with the base spec, as on a GPU host.
	wantResult(t, got, CheckContainerCDI, Fail, "CUDA: fail:CUDA driver version is insufficient")
	wantResult(t, got, CheckUnprepareWhole, Pass, "no longer resolve")
	wantResult(t, got, CheckPrepareShare, Pass, "4096 MiB, 50% SMs")
	wantResult(t, got, CheckContainerShare, Pass)
	wantResult(t, got, CheckAllocBelow, Pass, "limit 4096 MiB, allocated 1024 MiB: ok")
	wantResult(t, got, CheckAllocAbove, Pass, "allocated 5120 MiB: fail:out of memory")
	wantResult(t, got, CheckAllocRewritten, Fail, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81559M", "allocating 5120 MiB succeeded", "client side only")
	wantResult(t, got, CheckUnprepareShare, Pass)
	// The two-GPU MPS claim skips cleanly on a one-GPU host.
	wantResult(t, got, CheckPrepareShare2, Skip, "one GPU on this host")
	// A GPU not in MIG mode: the MIG rows only read its mode.
	wantResult(t, got, CheckMIGMode, Pass, "GPU 0: off")
	wantResult(t, got, CheckMIGCreate, Skip, "no GPU is in MIG mode")
	// The throughput rows, from the fake GPU's spin_fma times (fakeSpin:
	// 100 ms a repetition on the whole GPU, 100/cores times that in a share).
	wantResult(t, got, CheckSpinWhole, Pass, "median 100.00 ms", "132 SMs")
	wantResult(t, got, CheckSMLimit, Pass, "cores 30: 30.0 % of the whole GPU", "39 SMs in the share")
	wantResult(t, got, CheckColocIsolated, Pass, "30.0 % + 30.0 % + 30.0 % = 90.0 % of the whole GPU", "overlap 100 %")
	wantResult(t, got, CheckColocConcurrent, Pass, "= 90.0 % of the whole GPU")
	wantResult(t, got, CheckPriorityConc, Pass, "priority 0 finished 0 % sooner")
	wantResult(t, got, CheckPriorityConcFull, Pass, "raised to 100 by both clients", "priority 0 finished 50 % sooner")
	wantResult(t, got, CheckPriorityIsolated, Pass, "priority 0 finished 0 % sooner")
	wantResult(t, got, CheckGroupUnprepareFirst, Pass, "group-a unprepared", "40 repetitions computed right")
	wantResult(t, got, CheckGroupDaemonStops, Pass, "every process serving it gone")
	// The daemon pod as the chart runs it (root, SETUID and SETGID) serves
	// a client of another user; the fake GPU enforces the memory limit
	// from the client's environment. As a non-root user it serves only
	// its own user's clients.
	wantResult(t, got, CheckDaemonPodChart, Pass, "daemon UID 0, client UID 1000", "5120 MiB past a 4096 MiB limit: fail:out of memory", "cores 30: 30.0 %")
	wantResult(t, got, CheckDaemonPodNonRoot, Pass, "daemon UID 65532, client UID 1000: CUDA: MPS client failed to connect")
	wantResult(t, got, CheckDaemonPodNonRootSame, Pass, "daemon UID 65532, client UID 65532", "fail:out of memory", "cores 30: 30.0 %")
	if len(rep.Results) != 34 {
		t.Errorf("%d results, want 34", len(rep.Results))
	}
	if rep.ExitCode() != 1 {
		t.Errorf("exit code %d, want 1", rep.ExitCode())
	}
	// Every container ran with the runc, and under the runc root, of the config.
	for _, r := range host.runs {
		if strings.HasPrefix(r, "runc ") && !strings.HasPrefix(r, "runc --root "+cfg.WorkDir+"/runc ") {
			t.Errorf("runc call %q", r)
		}
	}
}

func TestRunOnGPUHostWithServerSideMPSLimits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs, serverLimitMiB: 4096}
	cfg := gpuConfig(t)
	got := results(t, Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir)).Results)
	wantResult(t, got, CheckAllocBelow, Pass)
	wantResult(t, got, CheckAllocAbove, Pass)
	wantResult(t, got, CheckAllocRewritten, Pass, "allocated 5120 MiB: fail:out of memory")
}

func TestRunWithoutNVCCFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs, nvccErr: errors.New(`exec: "nvcc": executable file not found in $PATH`)}
	cfg := gpuConfig(t)
	rep := Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir))
	got := results(t, rep.Results)
	wantResult(t, got, CheckProbeBuild, Fail, "executable file not found", "--nvcc")
	if _, ok := got[CheckContainerWhole]; ok {
		t.Error("containers ran without a probe")
	}
	if rep.ExitCode() != 1 {
		t.Errorf("exit code %d, want 1", rep.ExitCode())
	}
}

func TestRunDryRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d, err := discovery.NewMock("dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	host := &fakeHost{}
	cfg := gpuConfig(t)
	cfg.DryRun = true
	cfg.GPUIndex = 3
	rep := Run(ctx, cfg, suiteDeps(t, d, host.run, cfg.WorkDir))
	got := results(t, rep.Results)
	wantResult(t, got, CheckDiscovery, Pass, "8 GPU(s)", "dry run")
	wantResult(t, got, CheckSMIGPUs, Skip, "dry run")
	for _, name := range []string{CheckContainerWhole, CheckContainerCDI, CheckContainerShare} {
		wantResult(t, got, name, Pass, "/dev/nvidia3,", "dry run")
	}
	wantResult(t, got, CheckAllocRewritten, Skip, "needs a GPU")
	// The throughput rows prepare and check the MPS environment; the
	// daemon pod rows run the stand-in daemon as the pod's user.
	wantResult(t, got, CheckSpinWhole, Skip, "needs a GPU")
	for _, name := range []string{CheckSMLimit, CheckColocIsolated, CheckColocConcurrent, CheckPriorityConc, CheckPriorityConcFull, CheckPriorityIsolated} {
		wantResult(t, got, name, Pass, dryRunEnvOnly)
	}
	wantResult(t, got, CheckGroupUnprepareFirst, Pass, "dry run")
	wantResult(t, got, CheckGroupDaemonStops, Pass, "gone")
	wantResult(t, got, CheckDaemonPodChart, Pass, "ran as UID 0", "client UID 1000")
	wantResult(t, got, CheckDaemonPodNonRoot, Pass, "ran as UID 65532", "client UID 1000")
	if rep.ExitCode() != 0 {
		var b strings.Builder
		_ = rep.Print(&b)
		t.Errorf("exit code %d, want 0:\n%s", rep.ExitCode(), b.String())
	}
	for _, r := range host.runs {
		if strings.HasPrefix(r, "nvidia-smi") || strings.HasPrefix(r, "nvcc") {
			t.Errorf("dry run ran %q", r)
		}
	}
}

func TestRunUnknownGPU(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	cfg := gpuConfig(t)
	cfg.GPUIndex = 1
	got := results(t, Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, (&fakeHost{fixture: h, gpus: topo.GPUs}).run, cfg.WorkDir)).Results)
	wantResult(t, got, "claims: GPU", Fail, "no GPU with index 1")
}

func TestCheckHost(t *testing.T) {
	noStat := func(p string) (fs.FileInfo, error) {
		return nil, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
	}
	okStat := func(string) (fs.FileInfo, error) { return os.Stat(".") }
	noPath := func(p string) (string, error) { return "", errors.New("executable file not found in $PATH") }
	okPath := func(p string) (string, error) { return "/usr/bin/" + p, nil }

	err := CheckHost(noStat, noPath, "nvidia-smi")
	if !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "no NVIDIA GPU/driver found") ||
		!strings.Contains(err.Error(), "/dev/nvidiactl") || !strings.Contains(err.Error(), "nvidia-smi: executable file not found") ||
		!strings.Contains(err.Error(), "--dry-run") {
		t.Errorf("CheckHost on a host without GPU: %v", err)
	}
	if err := CheckHost(okStat, noPath, "/opt/nvidia-smi"); !errors.Is(err, ErrNoGPU) || !strings.Contains(err.Error(), "/opt/nvidia-smi") {
		t.Errorf("CheckHost without nvidia-smi: %v", err)
	}
	if err := CheckHost(okStat, okPath, "nvidia-smi"); err != nil {
		t.Errorf("CheckHost on a GPU host: %v", err)
	}
}

// With the base spec the plugin writes from the driver (nvcdi), a
// container whose root holds no driver files gets libcuda through CDI.
func TestBaseSpecGivesCDIOnlyContainerTheDriver(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs}
	cfg := gpuConfig(t)
	driverRoot := t.TempDir()
	for _, f := range []string{"usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05", "usr/bin/nvidia-smi"} {
		p := filepath.Join(driverRoot, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("fake"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := fakeDiscoverer{topo}
	deps := Deps{Run: host.run, Discoverer: d, NewPreparer: func(ctx context.Context) (Preparer, error) {
		return NewPluginPreparer(ctx, PluginPreparerOptions{
			WorkDir: cfg.WorkDir, NodeName: "gpucheck", Discoverer: d,
			MPSDaemon: mps.DirOnlyDaemon{}, Stat: DryRunStat,
			DriverRoot: driverRoot, BaseSpec: &kubeletplugin.BaseSpecOptions{HookPath: "/usr/local/bin/nvidia-cdi-hook"},
		})
	}}
	got := results(t, Run(ctx, cfg, deps).Results)
	wantResult(t, got, CheckContainerCDI, Pass)
	wantResult(t, got, CheckPrepareWhole, Pass, "gpu.gpulink.dev/base=driver")
}

// On a host with several GPUs the suite prepares a claim with an MPS share
// on each of two GPUs: its container gets both GPUs, a limit per device
// ordinal and the claim's pipe directory, and CUDA sees both.
func TestRunTwoGPUShareOnMultiGPUHost(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "dgx-a100")
	topo := h.discovered(t, nil)
	host := &fakeHost{fixture: h, gpus: topo.GPUs}
	cfg := gpuConfig(t)
	rep := Run(ctx, cfg, suiteDeps(t, fakeDiscoverer{topo}, host.run, cfg.WorkDir))
	got := results(t, rep.Results)
	wantResult(t, got, CheckPrepareShare2, Pass, "GPUs 0 and 1, 4096 MiB each")
	wantResult(t, got, CheckContainerShare2, Pass, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M,1=4096M")
	wantResult(t, got, CheckUnprepareShare2, Pass, "no longer resolve")
}
