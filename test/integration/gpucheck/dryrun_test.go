//go:build integration

// Package gpucheck_test runs the GPU acceptance suite's dry run with a real
// runc: the plugin's prepare code writes CDI specs for GPUs of the go-nvml
// mock, the CDI library injects them into OCI specs, and runc runs a shell
// in both root file system layouts, whose view of its environment and
// device nodes the suite checks. Needs root and runc on PATH (hack/cluster.sh
// build installs Debian's), or the bundle's when make test built it
// (_output/gpu-check/bin/runc); GPULINK_RUNC picks another.
package gpucheck_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/internal/gpucheck"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

func TestDryRunWithRunc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("runc containers need root")
	}
	runc := os.Getenv("GPULINK_RUNC")
	if bin := os.Getenv("GPULINK_BIN_DIR"); runc == "" && bin != "" {
		// make test builds the bundle first: test the runc it ships.
		if p := filepath.Join(bin, "..", "gpu-check", "bin", "runc"); fileExists(p) {
			runc = p
		}
	}
	if runc == "" {
		var err error
		if runc, err = exec.LookPath("runc"); err != nil {
			t.Fatalf("runc not found (hack/cluster.sh build installs it): %v", err)
		}
	}
	_, ctx := ktesting.NewTestContext(t)
	// GPU 7 in MIG mode without instances: the MIG rows create, probe and
	// destroy a partition there.
	d, err := discovery.NewMockWith("dgxh100", discovery.MockOptions{MIG: map[int][]string{7: nil}})
	if err != nil {
		t.Fatal(err)
	}
	instances, ok := discovery.MIGInstancesOf(d)
	if !ok {
		t.Fatal("the mock discoverer has no MIG instance manager")
	}
	work := t.TempDir()
	// The daemon pod rows run a stand-in nvidia-cuda-mps-control from a
	// driver root of their own, in the daemon's pod as its user.
	driverRoot := filepath.Join(work, "dry-run-driver-root")
	if err := gpucheck.WriteDryRunDriverRoot(driverRoot); err != nil {
		t.Fatal(err)
	}
	cfg := gpucheck.Config{
		DryRun: true, WorkDir: work, NodeName: "gpucheck", GPUIndex: 5,
		ShareMemoryBytes: 8 << 30, ShareCores: 30, Runc: runc, DaemonDriverRoot: driverRoot,
	}
	rep := gpucheck.Run(ctx, cfg, gpucheck.Deps{
		Run:        gpucheck.Exec,
		Discoverer: d,
		NewPreparer: func(ctx context.Context) (gpucheck.Preparer, error) {
			return gpucheck.NewPluginPreparer(ctx, gpucheck.PluginPreparerOptions{
				WorkDir: work, NodeName: "gpucheck", Discoverer: d,
				MPSDaemon: mps.DirOnlyDaemon{}, Stat: gpucheck.DryRunStat,
			})
		},
		NewPreparerWithDaemon: func(ctx context.Context, dir string, daemon mps.Daemon) (gpucheck.Preparer, error) {
			return gpucheck.NewPluginPreparer(ctx, gpucheck.PluginPreparerOptions{
				WorkDir: dir, NodeName: "gpucheck", Discoverer: d, MPSDaemon: daemon, Stat: gpucheck.DryRunStat,
			})
		},
		Stat: gpucheck.DryRunStat,
		MIG:  instances,
		NewMIGPreparer: func(ctx context.Context, gpu int) (gpucheck.Preparer, error) {
			return gpucheck.NewPluginPreparer(ctx, gpucheck.PluginPreparerOptions{
				WorkDir: filepath.Join(work, "mig"), NodeName: "gpucheck", Discoverer: d,
				MPSDaemon: mps.DirOnlyDaemon{}, Stat: gpucheck.DryRunStat, MIGOnDemand: strconv.Itoa(gpu),
			})
		},
	})
	var table strings.Builder
	if err := rep.Print(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("runc %s\n%s", runc, table.String())
	if rep.ExitCode() != 0 {
		t.Fatalf("dry run failed")
	}
	byName := map[string]gpucheck.Result{}
	for _, r := range rep.Results {
		byName[r.Name] = r
	}
	for _, name := range []string{gpucheck.CheckContainerWhole, gpucheck.CheckContainerCDI, gpucheck.CheckContainerShare} {
		r := byName[name]
		// The container saw the mock GPU 5's node and no other GPU's.
		if r.Status != gpucheck.Pass || !strings.Contains(r.Detail, "/dev/nvidia5,") {
			t.Errorf("%s: %s %s", name, r.Status, r.Detail)
		}
	}
	// The share rows prepared their claims and their containers got the
	// MPS environment of their mode; the daemon pods ran the stand-in
	// daemon as the pod's user, which could make its control pipe.
	for _, name := range []string{gpucheck.CheckSMLimit, gpucheck.CheckColocIsolated, gpucheck.CheckColocConcurrent,
		gpucheck.CheckPriorityConc, gpucheck.CheckPriorityConcFull, gpucheck.CheckPriorityIsolated,
		gpucheck.CheckGroupUnprepareFirst, gpucheck.CheckGroupDaemonStops,
		gpucheck.CheckDaemonPodChart, gpucheck.CheckDaemonPodNonRoot, gpucheck.CheckDaemonPodNonRootSame} {
		if r := byName[name]; r.Status != gpucheck.Pass {
			t.Errorf("%s: %s %s", name, r.Status, r.Detail)
		}
	}
	if r := byName[gpucheck.CheckDaemonPodChart]; !strings.Contains(r.Detail, "ran as UID 0") {
		t.Errorf("%s: %s", gpucheck.CheckDaemonPodChart, r.Detail)
	}
	// The partition's container saw GPU 7's node and the instance's cap
	// nodes; it was created and destroyed.
	for _, name := range []string{gpucheck.CheckMIGCreate, gpucheck.CheckMIGProbe, gpucheck.CheckMIGDestroy} {
		if r := byName[name]; r.Status != gpucheck.Pass {
			t.Errorf("%s: %s %s", name, r.Status, r.Detail)
		}
	}
	if r := byName[gpucheck.CheckMIGProbe]; !strings.Contains(r.Detail, "/dev/nvidia7,") || !strings.Contains(r.Detail, "/dev/nvidia-caps/nvidia-cap") {
		t.Errorf("%s: %s", gpucheck.CheckMIGProbe, r.Detail)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
