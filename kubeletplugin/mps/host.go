package mps

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// HostDaemon runs each claim's MPS control daemon as a process of this
// host (nvidia-cuda-mps-control -d from the driver root), with the same
// per-claim pipe, log and shm directories and the same server-side limits
// as PodDaemon. It is for hosts without Kubernetes, such as the GPU
// acceptance suite (make gpu-check): in the kubelet plugin's container a
// daemon started so would die with the container, which is why the plugin
// uses pods (doc.go, "MPS daemons").
type HostDaemon struct {
	ctl PodDaemon
}

// NewHostDaemon finds nvidia-cuda-mps-control and libcuda under
// driverRoot (a path of this host; "/" for a host install). run is
// ExecCommand when nil.
func NewHostDaemon(driverRoot string, run CommandRunner) (*HostDaemon, error) {
	if driverRoot == "" {
		return nil, errors.New("MPS host daemon: driver root is empty")
	}
	binDir, libDirs, err := findMPSDriver(driverRoot)
	if err != nil {
		return nil, err
	}
	if run == nil {
		run = ExecCommand
	}
	return &HostDaemon{ctl: PodDaemon{
		cfg:     PodDaemonConfig{DriverRoot: driverRoot, DriverRootMount: driverRoot, Run: run, PollInterval: 200 * time.Millisecond, StartTimeout: 30 * time.Second},
		binDir:  binDir,
		libDirs: libDirs,
	}}, nil
}

// Start launches the claim's daemon unless one already answers on its pipe
// directory, waits until it answers, and sets the claim's limits on it. A
// daemon that fails is stopped and its directories removed.
func (h *HostDaemon) Start(ctx context.Context, share Share, dirs Dirs) error {
	if err := dirs.create(); err != nil {
		return errors.Join(err, dirs.remove())
	}
	if err := h.start(ctx, share, dirs); err != nil {
		tail := logTail(filepath.Join(dirs.Log, "control.log"))
		return errors.Join(fmt.Errorf("%w%s", err, tail), h.Stop(ctx, share, dirs))
	}
	return nil
}

func (h *HostDaemon) start(ctx context.Context, share Share, dirs Dirs) error {
	d := &h.ctl
	root := d.cfg.DriverRootMount
	if _, err := d.control(ctx, share, dirs, "get_server_list"); err != nil {
		bin := d.controlBin(root)
		if out, err := d.cfg.Run(ctx, bin, []string{"-d"}, d.env(root, share, dirs), ""); err != nil {
			return fmt.Errorf("%s -d: %w (output: %q)", bin, err, string(out))
		}
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, d.cfg.PollInterval, d.cfg.StartTimeout, true, func(ctx context.Context) (bool, error) {
		_, last = d.control(ctx, share, dirs, "get_server_list")
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("MPS control daemon on %s did not answer within %s: %w (last: %v)", dirs.Pipe, d.cfg.StartTimeout, err, last)
	}
	return d.setLimits(ctx, share, dirs)
}

// ReassertLimits: see PodDaemon.ReassertLimits.
func (h *HostDaemon) ReassertLimits(ctx context.Context, share Share, dirs Dirs) error {
	return h.ctl.ReassertLimits(ctx, share, dirs)
}

// Stop sends quit to the claim's daemon (one that no longer answers counts
// as stopped) and removes its directories.
func (h *HostDaemon) Stop(ctx context.Context, share Share, dirs Dirs) error {
	d := &h.ctl
	var quitErr error
	if _, err := d.control(ctx, share, dirs, "get_server_list"); err == nil {
		if _, err := d.control(ctx, share, dirs, "quit"); err != nil {
			quitErr = err
		}
	}
	return errors.Join(quitErr, dirs.remove())
}
