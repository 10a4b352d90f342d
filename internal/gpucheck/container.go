package gpucheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// Runner runs a program and returns its combined output; the suite runs
// nvidia-smi, nvcc, ldd and runc through it, and tests replace it.
type Runner func(ctx context.Context, name string, args ...string) ([]byte, error)

// Container is one container the suite runs.
type Container struct {
	// ID names the container for runc; unique per run.
	ID string
	// Program is a host file copied to /gpucheck/<base name> in the
	// rootfs and run with Args.
	Program string
	Args    []string
	// Env is added to the spec's environment before the CDI edits.
	Env    []string
	Rootfs RootfsMode
	// User is the process's user; the zero value is root.
	User specs.User
}

// ProgramPath is where the program lies inside the container.
func (c Container) ProgramPath() string { return "/gpucheck/" + filepath.Base(c.Program) }

// BuildBundle writes an OCI bundle (config.json and rootfs/) for c into
// dir, with the CDI devices injected into the spec by the CDI library the
// way a CDI-enabled container runtime (containerd, CRI-O) does.
func BuildBundle(ctx context.Context, run Runner, dir string, c Container, specDirs, cdiDevices []string) (*specs.Spec, error) {
	rootfs := filepath.Join(dir, "rootfs")
	mounts, err := populateRootfs(ctx, run, rootfs, c)
	if err != nil {
		return nil, err
	}
	spec := baseSpec(append([]string{c.ProgramPath()}, c.Args...), c.Env)
	spec.Process.User = c.User
	spec.Mounts = append(spec.Mounts, mounts...)
	if err := InjectCDI(spec, specDirs, cdiDevices); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the OCI spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("writing the OCI spec: %w", err)
	}
	return spec, nil
}

// InjectCDI applies the container edits of the named CDI devices, found in
// specDirs, to spec.
func InjectCDI(spec *specs.Spec, specDirs, devices []string) error {
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specDirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("loading CDI specs from %v: %w", specDirs, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		var all []error
		for path, es := range errs {
			all = append(all, fmt.Errorf("%s: %w", path, errors.Join(es...)))
		}
		return fmt.Errorf("CDI spec errors: %w", errors.Join(all...))
	}
	unresolved, err := cache.InjectDevices(spec, devices...)
	if err != nil {
		return fmt.Errorf("injecting CDI devices %v (unresolved %v): %w", devices, unresolved, err)
	}
	return nil
}

// baseSpec is what `runc spec` writes, less the terminal, with a HOME
// CUDA can write its cache to, and without seccomp (the bundle's runc is
// built without libseccomp; the suite tests devices, not syscalls).
func baseSpec(args, env []string) *specs.Spec {
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: args,
			Env: append([]string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=/tmp",
			}, env...),
			Cwd:             "/",
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: "rootfs"},
		Hostname: "gpucheck",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			// A private /dev/shm, as a pod without hostIPC gets: whatever
			// MPS needs from the host's must come from the CDI spec.
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		},
		Linux: &specs.Linux{
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// RunContainer runs the bundle in dir with runc in the foreground and
// returns the container's output; runc removes the container when it ends.
func RunContainer(ctx context.Context, run Runner, runc, stateDir, dir, id string) ([]byte, error) {
	out, err := run(ctx, runc, "--root", stateDir, "run", "--bundle", dir, id)
	if err != nil {
		// A container killed by the timeout may be left behind.
		_, _ = run(context.WithoutCancel(ctx), runc, "--root", stateDir, "delete", "--force", id)
		return out, fmt.Errorf("runc run %s: %w", id, err)
	}
	return out, nil
}
