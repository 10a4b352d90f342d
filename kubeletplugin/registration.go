package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registration status.
//
// A plugin instance is ready once the kubelet has registered it: from then
// on the kubelet sends it NodePrepareResources calls (the newest
// registered instance gets them during a rolling update, rolling.go).
// Before that, a DaemonSet that counts the new pod available would delete
// the old one while the kubelet still has no plugin to call, or only the
// old one, which is stopping.
//
// The kubelet reports the outcome in a NotifyRegistrationStatus call on
// the helper's registration server. The helper keeps it
// (Helper.RegistrationStatus) without synchronization, so the plugin
// watches the call itself, through a gRPC interceptor the helper puts in
// front of the registration server as well as the DRA one.
//
// Readiness is also recorded as a file (Options.ReadyFile) because an HTTP
// probe cannot tell the two instances of a rolling update apart when they
// share the node's network: both serve the metrics port (SO_REUSEPORT) and
// the kernel picks which one answers. A file in the pod's own /tmp is
// checked by an exec probe in that pod.

// registrationState records what the kubelet said about this instance.
type registrationState struct {
	registered atomic.Bool
}

// Registered reports whether the kubelet has registered this instance.
func (d *Driver) Registered() bool {
	return d.registration.registered.Load()
}

// watchRegistration is a gRPC interceptor that notes a successful
// registration once the helper has accepted the kubelet's notification.
func (d *Driver) watchRegistration(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if info.FullMethod != registerapi.Registration_NotifyRegistrationStatus_FullMethodName {
		return resp, err
	}
	status, ok := req.(*registerapi.RegistrationStatus)
	if !ok || err != nil || !status.PluginRegistered {
		// The kubelet retries a failed registration; the instance stays
		// unready until one succeeds.
		return resp, err
	}
	if d.registration.registered.Swap(true) {
		return resp, err
	}
	logger := klog.FromContext(ctx)
	logger.Info("Registered with the kubelet")
	if d.opts.ReadyFile != "" {
		if werr := os.WriteFile(d.opts.ReadyFile, []byte("registered\n"), 0o644); werr != nil {
			// The probe keeps failing: visible, and the old instance of a
			// rolling update stays.
			logger.Error(werr, "Recording the registration failed; the readiness probe keeps failing", "readyFile", d.opts.ReadyFile)
		}
	}
	return resp, err
}

// resetRegistration forgets an earlier registration: the ready file a
// previous container of the same pod left (the pod's /tmp survives a
// container restart) must not make this one ready before it registers.
func (d *Driver) resetRegistration() error {
	d.registration.registered.Store(false)
	if d.opts.ReadyFile == "" {
		return nil
	}
	if err := os.Remove(d.opts.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing ready file %s: %w", d.opts.ReadyFile, err)
	}
	return nil
}

// unregistered marks the instance unready as Run ends: it stops serving.
func (d *Driver) unregistered(ctx context.Context) {
	if err := d.resetRegistration(); err != nil {
		klog.FromContext(ctx).Error(err, "Clearing the registration")
	}
}

// CheckReadyFile is the readiness probe's check: nil once the plugin that
// writes path has registered with the kubelet.
func CheckReadyFile(path string) error {
	if path == "" {
		return errors.New("--ready-file: empty, nothing to check")
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("not registered with the kubelet yet (no %s)", path)
		}
		return fmt.Errorf("checking ready file %s: %w", path, err)
	}
	return nil
}
