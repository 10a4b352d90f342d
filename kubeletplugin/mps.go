package kubeletplugin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver"
)

// MPSGPU identifies the GPU an MPS control daemon serves.
type MPSGPU struct {
	Index int
	// UUID is the GPU's UUID; empty when discovery does not know it
	// (topology-file and mock discovery), in which case the index is used.
	UUID string
}

// ID is the name of the GPU's MPS directory and the value of the daemon's
// CUDA_VISIBLE_DEVICES: the UUID, or the index when the UUID is unknown.
func (g MPSGPU) ID() string {
	if g.UUID != "" {
		return g.UUID
	}
	return driver.DeviceName(g.Index)
}

// visibleDevice is what CUDA_VISIBLE_DEVICES names the GPU by.
func (g MPSGPU) visibleDevice() string {
	if g.UUID != "" {
		return g.UUID
	}
	return fmt.Sprint(g.Index)
}

// MPSDirs are the directories of one GPU's MPS control daemon.
type MPSDirs struct {
	Pipe string
	Log  string
}

// create makes both directories.
func (d MPSDirs) create() error {
	for _, dir := range []string{d.Pipe, d.Log} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating MPS directory: %w", err)
		}
	}
	return nil
}

// MPSManager hands out references to per-GPU MPS control daemons: the first
// reference starts the GPU's daemon, releasing the last stops it.
type MPSManager interface {
	EnsureDaemon(ctx context.Context, gpu MPSGPU) error
	ReleaseDaemon(ctx context.Context, gpu MPSGPU) error
	// Dirs returns where the GPU's daemon keeps its pipes and logs.
	Dirs(gpu MPSGPU) MPSDirs
}

// MPSDaemon starts and stops one GPU's control daemon; MPSManager does the
// reference counting on top. Start must succeed when the daemon is already
// running, which is the case for daemons started before a plugin restart.
type MPSDaemon interface {
	Start(ctx context.Context, gpu MPSGPU, dirs MPSDirs) error
	Stop(ctx context.Context, gpu MPSGPU, dirs MPSDirs) error
}

type mpsManager struct {
	root   string
	daemon MPSDaemon

	mu   sync.Mutex
	refs map[string]int
}

// NewMPSManager counts references to the daemons under root
// (<root>/<gpu>/pipe and <root>/<gpu>/log) and starts and stops them with
// daemon.
func NewMPSManager(root string, daemon MPSDaemon) MPSManager {
	return &mpsManager{root: root, daemon: daemon, refs: map[string]int{}}
}

func (m *mpsManager) Dirs(gpu MPSGPU) MPSDirs {
	base := filepath.Join(m.root, gpu.ID())
	return MPSDirs{Pipe: filepath.Join(base, "pipe"), Log: filepath.Join(base, "log")}
}

func (m *mpsManager) EnsureDaemon(ctx context.Context, gpu MPSGPU) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := gpu.ID()
	if m.refs[id] == 0 {
		if err := m.daemon.Start(ctx, gpu, m.Dirs(gpu)); err != nil {
			return fmt.Errorf("starting MPS control daemon for GPU %s: %w", id, err)
		}
		klog.FromContext(ctx).Info("First MPS share on GPU, control daemon up", "gpu", id)
	}
	m.refs[id]++
	return nil
}

func (m *mpsManager) ReleaseDaemon(ctx context.Context, gpu MPSGPU) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := gpu.ID()
	n := m.refs[id]
	if n == 0 {
		return fmt.Errorf("releasing MPS control daemon for GPU %s: no reference held", id)
	}
	if n == 1 {
		if err := m.daemon.Stop(ctx, gpu, m.Dirs(gpu)); err != nil {
			// Keep the reference: the daemon still runs and a retried
			// unprepare must try to stop it again.
			return fmt.Errorf("stopping MPS control daemon for GPU %s: %w", id, err)
		}
		delete(m.refs, id)
		klog.FromContext(ctx).Info("Last MPS share on GPU released, control daemon stopped", "gpu", id)
		return nil
	}
	m.refs[id] = n - 1
	return nil
}

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

// ExecMPSDaemon controls real daemons with nvidia-cuda-mps-control.
type ExecMPSDaemon struct {
	// Control is the nvidia-cuda-mps-control binary (looked up in PATH
	// when it has no slash).
	Control string
	Run     CommandRunner
}

// NewExecMPSDaemon uses nvidia-cuda-mps-control from PATH.
func NewExecMPSDaemon() *ExecMPSDaemon {
	return &ExecMPSDaemon{Control: "nvidia-cuda-mps-control", Run: ExecCommand}
}

func (d *ExecMPSDaemon) env(gpu MPSGPU, dirs MPSDirs) []string {
	return []string{
		"CUDA_VISIBLE_DEVICES=" + gpu.visibleDevice(),
		"CUDA_MPS_PIPE_DIRECTORY=" + dirs.Pipe,
		"CUDA_MPS_LOG_DIRECTORY=" + dirs.Log,
	}
}

// running asks the daemon behind dirs.Pipe for its server list, which
// succeeds only while a control daemon listens there.
func (d *ExecMPSDaemon) running(ctx context.Context, gpu MPSGPU, dirs MPSDirs) bool {
	_, err := d.Run(ctx, d.Control, nil, d.env(gpu, dirs), "get_server_list\n")
	return err == nil
}

// Start launches `nvidia-cuda-mps-control -d` for the GPU unless a daemon
// already serves its pipe directory.
func (d *ExecMPSDaemon) Start(ctx context.Context, gpu MPSGPU, dirs MPSDirs) error {
	if err := dirs.create(); err != nil {
		return err
	}
	if d.running(ctx, gpu, dirs) {
		klog.FromContext(ctx).Info("MPS control daemon already running, adopting it", "gpu", gpu.ID(), "pipeDir", dirs.Pipe)
		return nil
	}
	if out, err := d.Run(ctx, d.Control, []string{"-d"}, d.env(gpu, dirs), ""); err != nil {
		return fmt.Errorf("%s -d: %w (output: %q)", d.Control, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Stop sends "quit" to the GPU's daemon; a daemon that is already gone
// counts as stopped.
func (d *ExecMPSDaemon) Stop(ctx context.Context, gpu MPSGPU, dirs MPSDirs) error {
	out, err := d.Run(ctx, d.Control, nil, d.env(gpu, dirs), "quit\n")
	if err != nil {
		if !d.running(ctx, gpu, dirs) {
			return nil
		}
		return fmt.Errorf("echo quit | %s: %w (output: %q)", d.Control, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DirOnlyMPSDaemon is used on nodes without NVIDIA drivers (mock and
// topology-file discovery): it creates the directories a daemon would use,
// so CDI mounts stay valid, and logs that no daemon runs.
type DirOnlyMPSDaemon struct{}

func (DirOnlyMPSDaemon) Start(ctx context.Context, gpu MPSGPU, dirs MPSDirs) error {
	if err := dirs.create(); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("No NVIDIA driver on this node: not starting an MPS control daemon, only its directories", "gpu", gpu.ID(), "pipeDir", dirs.Pipe)
	return nil
}

func (DirOnlyMPSDaemon) Stop(context.Context, MPSGPU, MPSDirs) error { return nil }
