package kubeletplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"k8s.io/klog/v2"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// The base spec: one per node, holding the driver's files (libraries,
// binaries, firmware, IPC sockets) and the nvidia-cdi-hook hooks, which
// are the same for every claim. Every prepared claim gets its device
// gpu.gpulink.dev/base=driver next to its own claim device.
const (
	CDIBaseClass  = "base"
	CDIBaseDevice = "driver"
)

// CDIBaseDeviceID is the qualified CDI name of the base device.
func CDIBaseDeviceID() string {
	return cdiparser.QualifiedName(CDIVendor, CDIBaseClass, CDIBaseDevice)
}

// DriverRoot says where the NVIDIA driver is, on the host and for this
// process.
type DriverRoot struct {
	// Host is the driver root on the host ("/" for a host install,
	// /run/nvidia/driver for the GPU Operator's driver container). The
	// host paths of CDI specs are under it.
	Host string
	// Mount is where this process sees Host (the same path when the plugin
	// runs on the host). Files are looked up under it.
	Mount string
}

func (r DriverRoot) mount() string {
	if r.Mount == "" {
		return r.Host
	}
	return r.Mount
}

// DevRoots returns the directory containing dev/ as seen by this process
// and on the host: the driver root when it has a dev directory (a driver
// container's root), else "/" (a host install, or the GPU Operator's root
// without its own /dev), as the NVIDIA container toolkit decides.
func (r DriverRoot) DevRoots() (mount, host string) {
	if fi, err := os.Stat(filepath.Join(r.mount(), "dev")); err == nil && fi.IsDir() {
		return r.mount(), r.Host
	}
	return "/", "/"
}

// knownHooks are the nvidia-cdi-hook hooks nvcdi may put into the base spec.
var knownHooks = []nvcdi.HookName{
	nvcdi.CreateSymlinksHook, nvcdi.UpdateLDCacheHook, nvcdi.EnableCudaCompatHook,
	nvcdi.DisableDeviceNodeModificationHook, "update-application-profile",
}

// BaseSpecOptions configure the base spec.
type BaseSpecOptions struct {
	Root DriverRoot
	// HookPath is the host path of nvidia-cdi-hook written into hooks.
	HookPath string
	// DisabledHooks are nvidia-cdi-hook hooks left out (e.g.
	// update-ldcache for images without ldconfig).
	DisabledHooks []string
	// NVML reports the driver version; nil infers it from the version
	// suffix of libcuda.so.<version> under the root (fake driver roots).
	NVML nvml.Interface
}

// nvcdiLogger routes the toolkit's logging to klog.
type nvcdiLogger struct{ l klog.Logger }

func (n nvcdiLogger) Debugf(f string, a ...any) { n.l.V(5).Info(fmt.Sprintf(f, a...)) }
func (n nvcdiLogger) Tracef(f string, a ...any) { n.l.V(6).Info(fmt.Sprintf(f, a...)) }
func (n nvcdiLogger) Infof(f string, a ...any)  { n.l.V(4).Info(fmt.Sprintf(f, a...)) }
func (n nvcdiLogger) Warningf(f string, a ...any) {
	n.l.V(2).Info("nvcdi warning: " + fmt.Sprintf(f, a...))
}
func (n nvcdiLogger) Errorf(f string, a ...any) { n.l.Error(nil, fmt.Sprintf(f, a...)) }

// noNVML makes nvcdi infer the driver version from library file names:
// Init fails, so its versioner reports nothing.
type noNVML struct{ nvml.Interface }

func (noNVML) Init() nvml.Return     { return nvml.ERROR_LIBRARY_NOT_FOUND }
func (noNVML) Shutdown() nvml.Return { return nvml.SUCCESS }

// BuildBaseSpec generates the node's common container edits with the
// NVIDIA container toolkit's nvcdi from the driver root and returns them
// as the base spec, host paths rewritten from Root.Mount to Root.Host. It
// fails, naming the root, when no driver is there.
//
// Left out of the base spec: NVIDIA_VISIBLE_DEVICES=void (each claim sets
// its own list; two values would depend on injection order) and the
// control device nodes, which every claim spec carries itself so that a
// missing /dev/nvidia-uvm is handled at prepare (see ensureUVMNodes).
func BuildBaseSpec(logger klog.Logger, o BaseSpecOptions) (*cdispec.Spec, error) {
	mount := o.Root.mount()
	if o.Root.Host == "" || !filepath.IsAbs(o.Root.Host) {
		return nil, fmt.Errorf("--driver-root: %q is not an absolute path", o.Root.Host)
	}
	if !filepath.IsAbs(mount) {
		return nil, fmt.Errorf("--driver-root-mount: %q is not an absolute path", mount)
	}
	if o.HookPath == "" || !filepath.IsAbs(o.HookPath) {
		return nil, fmt.Errorf("--cdi-hook-path: %q is not an absolute path", o.HookPath)
	}
	for _, h := range o.DisabledHooks {
		if !slices.Contains(knownHooks, nvcdi.HookName(h)) {
			return nil, fmt.Errorf("--cdi-disable-hooks: unknown hook %q (want some of %v)", h, knownHooks)
		}
	}
	if fi, err := os.Stat(mount); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("driver root %s (host path %s): not a directory: %w", mount, o.Root.Host, errOr(err, "not a directory"))
	}
	lib := o.NVML
	if lib == nil {
		lib = noNVML{}
	}
	devMount, devHost := o.Root.DevRoots()
	cdilib, err := nvcdi.New(
		nvcdi.WithLogger(nvcdiLogger{logger.WithName("nvcdi")}),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(mount),
		nvcdi.WithDevRoot(devMount),
		nvcdi.WithNVIDIACDIHookPath(o.HookPath),
		nvcdi.WithNvmlLib(lib),
		nvcdi.WithDisabledHooks(o.DisabledHooks...),
		// nvsandboxutils would be loaded from the root and initialized at
		// every start; NVML (or the file names) give the version just as well.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
		nvcdi.WithVendor(CDIVendor),
		nvcdi.WithClass(CDIBaseClass),
	)
	if err != nil {
		return nil, fmt.Errorf("driver root %s: creating nvcdi library: %w", mount, err)
	}
	edits, err := cdilib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("driver root %s (host path %s): no usable NVIDIA driver (want libcuda.so.<version> or libnvidia-ml.so.<version> in its lib directories): %w", mount, o.Root.Host, err)
	}
	ce := *edits.ContainerEdits
	ce.Env = slices.DeleteFunc(ce.Env, func(kv string) bool { return strings.HasPrefix(kv, "NVIDIA_VISIBLE_DEVICES=") })
	ce.DeviceNodes = slices.DeleteFunc(ce.DeviceNodes, func(n *cdispec.DeviceNode) bool {
		return slices.Contains(driver.ControlDeviceNodes(), n.Path)
	})
	// Containers talk to their claim's MPS daemon through the pipe
	// directory, which MPS clients need; the control program would only
	// give them a ready tool to change the daemon's limits. Leaving it out
	// does not make that impossible (the protocol is plain text on a pipe),
	// which is why the plugin also sets the limits again periodically
	// (mps.LimitEnforcer, README.md "What MPS guarantees").
	ce.Mounts = slices.DeleteFunc(ce.Mounts, func(m *cdispec.Mount) bool {
		return filepath.Base(m.ContainerPath) == mps.ControlBinary
	})
	if !hasMountOf(ce.Mounts, "libcuda.so.") {
		return nil, fmt.Errorf("driver root %s (host path %s): libcuda.so.<version> not found in its lib directories; is the NVIDIA driver installed there?", mount, o.Root.Host)
	}
	spec := &cdispec.Spec{
		Kind:        CDIVendor + "/" + CDIBaseClass,
		Annotations: map[string]string{driver.Name + "/driver-root": o.Root.Host},
		Devices:     []cdispec.Device{{Name: CDIBaseDevice, ContainerEdits: ce}},
	}
	// Host paths: nvcdi reports what it found under mount; the container
	// runtime resolves them on the host.
	if err := transformroot.NewDriverTransformer(
		transformroot.WithDriverRoot(mount),
		transformroot.WithTargetDriverRoot(o.Root.Host),
		transformroot.WithDevRoot(devMount),
		transformroot.WithTargetDevRoot(devHost),
	).Transform(spec); err != nil {
		return nil, fmt.Errorf("rewriting driver root %s to host path %s: %w", mount, o.Root.Host, err)
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec version: %w", err)
	}
	spec.Version = v
	return spec, nil
}

func hasMountOf(ms []*cdispec.Mount, prefix string) bool {
	for _, m := range ms {
		if strings.HasPrefix(filepath.Base(m.ContainerPath), prefix) {
			return true
		}
	}
	return false
}

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}
