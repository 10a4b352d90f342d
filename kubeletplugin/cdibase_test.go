package kubeletplugin

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const fakeDriverVersion = "580.95.05"

// fakeDriverRoot lays out the files of a driver install under a temp
// directory, as a host or driver container would have them.
func fakeDriverRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	lib := "usr/lib/x86_64-linux-gnu"
	files := []string{
		lib + "/libcuda.so." + fakeDriverVersion,
		lib + "/libnvidia-ml.so." + fakeDriverVersion,
		lib + "/libnvidia-ptxjitcompiler.so." + fakeDriverVersion,
		"usr/bin/nvidia-smi",
		"usr/bin/nvidia-cuda-mps-control",
		"lib/firmware/nvidia/" + fakeDriverVersion + "/gsp_ga10x.bin",
		"run/nvidia-persistenced/socket",
	}
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("fake"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		lib + "/libcuda.so.1":      "libcuda.so." + fakeDriverVersion,
		lib + "/libnvidia-ml.so.1": "libnvidia-ml.so." + fakeDriverVersion,
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const testHook = "/var/lib/kubelet/plugins/gpu.gpulink.dev/bin/nvidia-cdi-hook"

func mountsOf(e cdispec.ContainerEdits) map[string]string {
	m := map[string]string{}
	for _, mt := range e.Mounts {
		m[mt.ContainerPath] = mt.HostPath
	}
	return m
}

func TestBaseSpecFromFakeDriverRoot(t *testing.T) {
	root := fakeDriverRoot(t)
	for name, host := range map[string]string{"driver container": "/run/nvidia/driver", "host install": root} {
		t.Run(name, func(t *testing.T) {
			spec, err := BuildBaseSpec(testLogger(t), BaseSpecOptions{Root: DriverRoot{Host: host, Mount: root}, HookPath: testHook})
			if err != nil {
				t.Fatal(err)
			}
			if spec.Kind != "gpu.gpulink.dev/base" || len(spec.Devices) != 1 || spec.Devices[0].Name != CDIBaseDevice {
				t.Fatalf("spec kind %s devices %+v", spec.Kind, spec.Devices)
			}
			e := spec.Devices[0].ContainerEdits
			lib := "/usr/lib/x86_64-linux-gnu/"
			want := map[string]string{}
			for _, p := range []string{
				lib + "libcuda.so." + fakeDriverVersion,
				lib + "libnvidia-ml.so." + fakeDriverVersion,
				lib + "libnvidia-ptxjitcompiler.so." + fakeDriverVersion,
				"/usr/bin/nvidia-smi",
				// not /usr/bin/nvidia-cuda-mps-control: containers get
				// no tool to change their MPS daemon's limits
				"/lib/firmware/nvidia/" + fakeDriverVersion + "/gsp_ga10x.bin",
				"/run/nvidia-persistenced/socket",
			} {
				want[p] = filepath.Join(host, p)
			}
			if got := mountsOf(e); !maps.Equal(got, want) {
				t.Errorf("mounts (container -> host)\n got %v\nwant %v", got, want)
			}
			var hooks []string
			for _, h := range e.Hooks {
				if h.Path != testHook {
					t.Errorf("hook %v runs %s, want %s", h.Args, h.Path, testHook)
				}
				if len(h.Args) > 1 {
					hooks = append(hooks, h.Args[1])
				}
			}
			for _, h := range []string{"create-symlinks", "update-ldcache"} {
				if !slices.Contains(hooks, h) {
					t.Errorf("hook %s missing; have %v", h, hooks)
				}
			}
			for _, kv := range e.Env {
				if strings.HasPrefix(kv, "NVIDIA_VISIBLE_DEVICES=") {
					t.Errorf("base spec sets %s; only claim specs may", kv)
				}
			}
			for _, n := range e.DeviceNodes {
				t.Errorf("base spec has device node %s", n.Path)
			}
		})
	}
}

func TestBaseSpecDisabledHook(t *testing.T) {
	spec, err := BuildBaseSpec(testLogger(t), BaseSpecOptions{Root: DriverRoot{Host: fakeDriverRoot(t)}, HookPath: testHook, DisabledHooks: []string{"update-ldcache"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range spec.Devices[0].ContainerEdits.Hooks {
		if slices.Contains(h.Args, "update-ldcache") {
			t.Errorf("disabled hook present: %v", h.Args)
		}
	}
}

func TestBaseSpecMissingDriver(t *testing.T) {
	empty := t.TempDir()
	for name, o := range map[string]BaseSpecOptions{
		"empty root":    {Root: DriverRoot{Host: "/run/nvidia/driver", Mount: empty}, HookPath: testHook},
		"no such root":  {Root: DriverRoot{Host: filepath.Join(empty, "nope")}, HookPath: testHook},
		"relative hook": {Root: DriverRoot{Host: fakeDriverRoot(t)}, HookPath: "nvidia-cdi-hook"},
		"relative root": {Root: DriverRoot{Host: "driver"}, HookPath: testHook},
		"unknown hook":  {Root: DriverRoot{Host: fakeDriverRoot(t)}, HookPath: testHook, DisabledHooks: []string{"update-ldcach"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := BuildBaseSpec(testLogger(t), o)
			if err == nil {
				t.Fatal("no error")
			}
			if name == "unknown hook" && !strings.Contains(err.Error(), `"update-ldcach"`) {
				t.Errorf("error does not name the hook: %v", err)
			}
			if name != "relative hook" && name != "unknown hook" && !strings.Contains(err.Error(), o.Root.Host) {
				t.Errorf("error does not name the root %s: %v", o.Root.Host, err)
			}
			t.Log(err)
		})
	}
}

// withDriverFiles puts a fake driver install into the env's driver root.
func withDriverFiles(t *testing.T, e *env) {
	t.Helper()
	src := fakeDriverRoot(t)
	if err := os.CopyFS(e.driverRoot, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	e.opts.BaseSpec = &BaseSpecOptions{HookPath: testHook}
	e.opts.RequireDriver = true
}

func TestPrepareWithBaseSpec(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	withDriverFiles(t, e)
	d := e.start()
	if _, err := os.Stat(filepath.Join(e.cdiDir, baseSpecFileName)); err != nil {
		t.Fatalf("base spec not written: %v", err)
	}
	c := newClaim("train", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 2)})
	devs := mustPrepare(t, d, c)
	for _, dev := range devs {
		if want := []string{CDIDeviceIDForDevice(c.UID, dev.DeviceName), CDIBaseDeviceID(), CDIDeviceID(c.UID)}; !slices.Equal(dev.CDIDeviceIDs, want) {
			t.Fatalf("CDI devices %v, want %v", dev.CDIDeviceIDs, want)
		}
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatalf("CDI library rejects the spec directory: %v", err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if unresolved, err := cache.InjectDevices(spec, devs[0].CDIDeviceIDs...); err != nil {
		t.Fatalf("injecting: %v (unresolved %v)", err, unresolved)
	}
	if got, want := deviceNodes(spec), []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia2", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v (only the claimed GPU)", got, want)
	}
	if got := envMap(spec)["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-00000002-0000-0000-0000-000000000000" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%s", got)
	}
	var libcuda bool
	for _, m := range spec.Mounts {
		if m.Destination == "/usr/lib/x86_64-linux-gnu/libcuda.so."+fakeDriverVersion && m.Source == filepath.Join(e.driverRoot, m.Destination) {
			libcuda = true
		}
	}
	if !libcuda {
		t.Errorf("libcuda not mounted: %+v", spec.Mounts)
	}

	// A restart without driver files (simulated GPUs) removes the base
	// spec and stops returning its device.
	e.opts.BaseSpec, e.opts.RequireDriver = nil, false
	d = e.start()
	if _, err := os.Stat(filepath.Join(e.cdiDir, baseSpecFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale base spec left: %v", err)
	}
	sim := newClaim("sim", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 1)})
	devs = mustPrepare(t, d, sim)
	if want := []string{CDIDeviceIDForDevice(sim.UID, "gpu-1"), CDIDeviceID(sim.UID)}; !slices.Equal(devs[0].CDIDeviceIDs, want) {
		t.Errorf("CDI devices %v without a base spec, want %v", devs[0].CDIDeviceIDs, want)
	}
}

func TestStartFailsWithoutDriver(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	e.opts.BaseSpec = &BaseSpecOptions{HookPath: testHook}
	e.opts.RequireDriver = true
	_, err := e.newDriver()
	if err == nil || !strings.Contains(err.Error(), e.driverRoot) || !strings.Contains(err.Error(), "libcuda") {
		t.Fatalf("New: %v, want an error naming %s and libcuda", err, e.driverRoot)
	}
	// Simulated GPUs start anyway, without a base spec.
	e.opts.RequireDriver = false
	d := e.start()
	if d.baseID != "" {
		t.Errorf("base device %s without a driver", d.baseID)
	}
}

func TestInstallCDIHook(t *testing.T) {
	src := filepath.Join(t.TempDir(), "hook")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "bin")
	for range 2 { // replacing an installed hook works too
		p, err := InstallCDIHook(src, dir)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o755 || p != filepath.Join(dir, "nvidia-cdi-hook") {
			t.Fatalf("installed %s: %v %v", p, fi, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	if _, err := InstallCDIHook(filepath.Join(dir, "missing"), dir); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing source: %v", err)
	}
}

// The plugin sees the driver root at another path than the host has it
// (the chart mounts it at /driver-root): lookups go to the mount, CDI host
// paths to the host's root.
func TestDriverRootMountedElsewhere(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	withDriverFiles(t, e)
	e.opts.DriverRootMount = e.driverRoot
	e.opts.DriverRoot = "/run/nvidia/driver"
	d := e.start()
	c := newClaim("c", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)})
	mustPrepare(t, d, c)
	raw, err := cdiapi.ReadSpec(e.specPath(c.UID), 0)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, dev := range raw.Devices {
		for _, n := range dev.ContainerEdits.DeviceNodes {
			if n.HostPath != filepath.Join("/run/nvidia/driver", n.Path) {
				t.Errorf("device node %s has host path %s", n.Path, n.HostPath)
			}
			nodes = append(nodes, n.Path)
		}
	}
	slices.Sort(nodes)
	if want := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia3", "/dev/nvidiactl"}; !slices.Equal(nodes, want) {
		t.Errorf("device nodes %v, want %v", nodes, want)
	}
	base, err := cdiapi.ReadSpec(filepath.Join(e.cdiDir, baseSpecFileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range base.Devices[0].ContainerEdits.Mounts {
		if m.HostPath != filepath.Join("/run/nvidia/driver", m.ContainerPath) {
			t.Errorf("mount %s has host path %s", m.ContainerPath, m.HostPath)
		}
	}
	if base.Annotations["gpu.gpulink.dev/driver-root"] != "/run/nvidia/driver" {
		t.Errorf("annotations %v", base.Annotations)
	}
}
