package gpucheck

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// preparedSpec prepares claim with the plugin's code on the h100-1 fixture
// and builds a bundle for it.
func preparedSpec(t *testing.T, share bool) (*specs.Spec, Preparer, []string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	work := t.TempDir()
	prep, err := NewPluginPreparer(ctx, PluginPreparerOptions{
		WorkDir: work, NodeName: "node", Discoverer: fakeDiscoverer{h.discovered(t, nil)},
		MPSDaemon: mps.DirOnlyDaemon{}, Stat: DryRunStat, RealGPUs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	claim := WholeClaim("node", 0)
	if share {
		claim = ShareClaim("node", 0, 2<<30, 30)
	}
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(work, "probe")
	if err := os.WriteFile(prog, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "bundle")
	spec, err := BuildBundle(ctx, nil, dir, Container{Program: prog, Args: []string{"--alloc-mib", "1"}, Rootfs: RootfsHost}, prep.SpecDirs(), ids)
	if err != nil {
		t.Fatal(err)
	}
	var onDisk specs.Spec
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &onDisk); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(onDisk.Process.Env, spec.Process.Env) || len(onDisk.Linux.Devices) != len(spec.Linux.Devices) {
		t.Errorf("config.json differs from the returned spec")
	}
	return spec, prep, ids
}

func TestWholeClaimInjectedIntoOCISpec(t *testing.T) {
	spec, _, _ := preparedSpec(t, false)
	if got := strings.Join(spec.Process.Args, " "); got != "/gpucheck/probe --alloc-mib 1" {
		t.Errorf("args %q", got)
	}
	if !slices.Contains(spec.Process.Env, "NVIDIA_VISIBLE_DEVICES=GPU-6b3a1f2e-8c4d-4f5e-9a7b-1c2d3e4f5a6b") {
		t.Errorf("env %v lacks the claimed GPU", spec.Process.Env)
	}
	var null unix.Stat_t
	if err := unix.Stat("/dev/null", &null); err != nil {
		t.Fatal(err)
	}
	major, minor := int64(unix.Major(null.Rdev)), int64(unix.Minor(null.Rdev))
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
		if d.Type != "c" || d.Major != major || d.Minor != minor {
			t.Errorf("device %+v, want the stand-in char device %d:%d", d, major, minor)
		}
	}
	if got := strings.Join(paths, " "); got != "/dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools" {
		t.Errorf("device nodes %s", got)
	}
	// CDI allows exactly the injected devices in the device cgroup, after
	// the base spec's deny-all.
	rules := spec.Linux.Resources.Devices
	if len(rules) < 2 || rules[0].Allow || !rules[len(rules)-1].Allow || *rules[len(rules)-1].Major != major {
		t.Errorf("device cgroup rules %+v", rules)
	}
	if !slices.ContainsFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/usr" && m.Type == "overlay" }) {
		t.Errorf("host rootfs without the host's /usr under a scratch overlay: %+v", spec.Mounts)
	}
}

func TestShareClaimInjectedIntoOCISpec(t *testing.T) {
	spec, prep, ids := preparedSpec(t, true)
	var pipe string
	for _, e := range spec.Process.Env {
		if v, ok := strings.CutPrefix(e, "CUDA_MPS_PIPE_DIRECTORY="); ok {
			pipe = v
		}
	}
	if pipe == "" || !slices.Contains(spec.Process.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M") {
		t.Errorf("env %v lacks the MPS settings", spec.Process.Env)
	}
	if !slices.ContainsFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == pipe && m.Source == pipe }) {
		t.Errorf("no mount of the MPS pipe directory %s: %+v", pipe, spec.Mounts)
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := prep.Unprepare(ctx, ShareClaim("node", 0, 2<<30, 30)); err != nil {
		t.Fatal(err)
	}
	if err := InjectCDI(&specs.Spec{Process: &specs.Process{}}, prep.SpecDirs(), ids); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices") {
		t.Errorf("injecting an unprepared claim: %v", err)
	}
}

func TestInjectCDIReportsBrokenSpecs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte(`{"cdiVersion": "0.6.0", "kind": "x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	err := InjectCDI(&specs.Spec{Process: &specs.Process{}}, []string{dir}, []string{"a.com/b=c"})
	if err == nil || !strings.Contains(err.Error(), "broken.json") {
		t.Errorf("broken spec: %v", err)
	}
}

func TestPreparerFailsOnMissingDeviceNodes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := loadHost(t, "h100-1")
	prep, err := NewPluginPreparer(ctx, PluginPreparerOptions{
		WorkDir: t.TempDir(), NodeName: "node", Discoverer: fakeDiscoverer{h.discovered(t, nil)},
		MPSDaemon: mps.DirOnlyDaemon{}, RealGPUs: true,
		Stat: func(p string) (os.FileInfo, error) {
			return nil, &os.PathError{Op: "stat", Path: p, Err: os.ErrNotExist}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prep.Prepare(context.Background(), WholeClaim("node", 0)); err == nil || !strings.Contains(err.Error(), "/dev/nvidia0") {
		t.Errorf("prepare without device nodes: %v", err)
	}
	if _, err := NewPluginPreparer(ctx, PluginPreparerOptions{}); err == nil || !strings.Contains(err.Error(), "required") {
		t.Errorf("empty options: %v", err)
	}
}
