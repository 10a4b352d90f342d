package kubeletplugin

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// hostControl plays nvidia-cuda-mps-control on a host: "-d" brings the
// daemon up, everything else goes to the fake control client.
func hostControl(ctl *fakeControl, daemonStarts *int) CommandRunner {
	return func(ctx context.Context, name string, args, env []string, stdin string) ([]byte, error) {
		if slices.Equal(args, []string{"-d"}) {
			ctl.mu.Lock()
			ctl.up = true
			*daemonStarts++
			ctl.mu.Unlock()
			return nil, nil
		}
		return ctl.run(ctx, name, args, env, stdin)
	}
}

func TestHostMPSDaemonSetsClaimLimitsAndCleansUp(t *testing.T) {
	root := fakeMPSDriverRoot(t)
	ctl := &fakeControl{}
	starts := 0
	d, err := NewHostMPSDaemon(root, hostControl(ctl, &starts))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMPSManager(t.TempDir(), d)
	share := MPSShare{Claim: types.UID("11111111-2222-3333-4444-555555555555"), GPU: MPSGPU{Index: 0, UUID: "GPU-0"}, MemoryBytes: 3 * gib, Cores: 40}
	if err := m.EnsureDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	if starts != 1 {
		t.Errorf("daemon started %d times, want 1", starts)
	}
	for _, want := range []string{"set_default_active_thread_percentage 40", "set_default_device_pinned_mem_limit 0 3072M"} {
		if !slices.Contains(ctl.commands, want) {
			t.Errorf("commands %q lack %q", ctl.commands, want)
		}
	}
	if !slices.Contains(ctl.envs[0], "CUDA_VISIBLE_DEVICES=GPU-0") || !slices.Contains(ctl.envs[0], "CUDA_MPS_PIPE_DIRECTORY="+m.Dirs(share).Pipe) {
		t.Errorf("control env %q", ctl.envs[0])
	}
	if ctl.bins[0] != root+"/usr/bin/nvidia-cuda-mps-control" {
		t.Errorf("control binary %q, want the driver root's", ctl.bins[0])
	}
	if err := m.ReleaseDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	if ctl.commands[len(ctl.commands)-1] != "quit" {
		t.Errorf("last command %q, want quit", ctl.commands[len(ctl.commands)-1])
	}
	if _, err := os.Stat(m.Dirs(share).Pipe); !os.IsNotExist(err) {
		t.Errorf("pipe directory left behind: %v", err)
	}
}

func TestHostMPSDaemonRefusedLimitStopsDaemon(t *testing.T) {
	ctl := &fakeControl{failCmd: "set_default_device_pinned_mem_limit"}
	starts := 0
	d, err := NewHostMPSDaemon(fakeMPSDriverRoot(t), hostControl(ctl, &starts))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMPSManager(t.TempDir(), d)
	share := MPSShare{Claim: "c", GPU: MPSGPU{Index: 0}, MemoryBytes: gib, Cores: 10}
	err = m.EnsureDaemon(t.Context(), share)
	if err == nil || !strings.Contains(err.Error(), "set_default_device_pinned_mem_limit") {
		t.Fatalf("error %v, want the refused limit named", err)
	}
	if !slices.Contains(ctl.commands, "quit") {
		t.Errorf("daemon not stopped after the refused limit: commands %q", ctl.commands)
	}
	if _, err := os.Stat(m.Dirs(share).Pipe); !os.IsNotExist(err) {
		t.Errorf("pipe directory left behind: %v", err)
	}
}

func TestNewHostMPSDaemonNeedsTheDriver(t *testing.T) {
	if _, err := NewHostMPSDaemon(t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "nvidia-cuda-mps-control") {
		t.Errorf("error %v, want the missing control binary named", err)
	}
}
