package mps

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"
)

// CommandRunner runs a program with extra environment variables and stdin
// and returns its combined output.
type CommandRunner func(ctx context.Context, name string, args, env []string, stdin string) ([]byte, error)

// ExecCommand is the CommandRunner that runs real processes.
func ExecCommand(ctx context.Context, name string, args, env []string, stdin string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// DirOnlyDaemon is used on nodes without NVIDIA drivers (mock and
// topology-file discovery): it creates the directories a daemon would use,
// so CDI mounts stay valid, and logs that no daemon runs.
type DirOnlyDaemon struct{}

func (DirOnlyDaemon) Start(ctx context.Context, share Share, dirs Dirs) error {
	if err := dirs.create(); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("No NVIDIA driver on this node: not starting an MPS control daemon, only its directories", "claimUID", share.ID(), "gpus", share.gpuIDs(), "pipeDir", dirs.Pipe)
	return nil
}

func (DirOnlyDaemon) Stop(_ context.Context, _ Share, dirs Dirs) error {
	return dirs.remove()
}

// UnavailableDaemon stands in when the node cannot run MPS daemons
// (no nvidia-cuda-mps-control in the driver root, no daemon image): the
// plugin serves whole GPUs and other strategies, and every MPS claim fails
// with Err.
type UnavailableDaemon struct{ Err error }

func (u UnavailableDaemon) Start(context.Context, Share, Dirs) error {
	return fmt.Errorf("MPS sharing is unavailable on this node: %w", u.Err)
}

func (UnavailableDaemon) Stop(_ context.Context, _ Share, dirs Dirs) error {
	return dirs.remove()
}
