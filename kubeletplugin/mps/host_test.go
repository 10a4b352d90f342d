package mps

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
	d, err := NewHostDaemon(root, hostControl(ctl, &starts))
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: types.UID("11111111-2222-3333-4444-555555555555"), GPUs: []Device{{GPU: GPU{Index: 0, UUID: "GPU-0"}, MemoryBytes: 3 * gib}}, Cores: 40}
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
	d, err := NewHostDaemon(fakeMPSDriverRoot(t), hostControl(ctl, &starts))
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "c", GPUs: []Device{{GPU: GPU{Index: 0}, MemoryBytes: gib}}, Cores: 10}
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
	if _, err := NewHostDaemon(t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "nvidia-cuda-mps-control") {
		t.Errorf("error %v, want the missing control binary named", err)
	}
}

// A claim with MPS shares on two GPUs: one host daemon sees both (in the
// share's order), and each GPU's limit goes to its ordinal as the daemon
// numbers it; a daemon refusing the second GPU's limit is stopped.
func TestHostMPSDaemonTwoGPUs(t *testing.T) {
	root := fakeMPSDriverRoot(t)
	ctl := &fakeControl{}
	starts := 0
	d, err := NewHostDaemon(root, hostControl(ctl, &starts))
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "pair", Cores: 25, GPUs: []Device{
		{GPU: GPU{Index: 2, UUID: "GPU-2"}, MemoryBytes: 8000 << 20},
		{GPU: GPU{Index: 5, UUID: "GPU-5"}, MemoryBytes: 4000 << 20},
	}}
	if err := m.EnsureDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	if starts != 1 {
		t.Errorf("daemon started %d times, want 1", starts)
	}
	want := []string{"set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 0 8000M", "set_default_device_pinned_mem_limit 1 4000M"}
	if got := ctl.commands[len(ctl.commands)-3:]; !slices.Equal(got, want) {
		t.Errorf("limit commands %q, want %q (all: %q)", got, want, ctl.commands)
	}
	if !slices.Contains(ctl.envs[0], "CUDA_VISIBLE_DEVICES=GPU-2,GPU-5") {
		t.Errorf("control env %q, want both GPUs visible in the share's order", ctl.envs[0])
	}
	if err := m.ReleaseDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	if ctl.commands[len(ctl.commands)-1] != "quit" {
		t.Errorf("last command %q, want quit", ctl.commands[len(ctl.commands)-1])
	}

	// Without UUIDs the daemon gets the indices.
	ctl2 := &fakeControl{failCmd: "set_default_device_pinned_mem_limit 1"}
	d2, err := NewHostDaemon(root, hostControl(ctl2, &starts))
	if err != nil {
		t.Fatal(err)
	}
	m2 := NewManager(t.TempDir(), d2)
	noUUID := Share{Claim: "pair2", Cores: 25, GPUs: []Device{{GPU: GPU{Index: 0}, MemoryBytes: gib}, {GPU: GPU{Index: 1}, MemoryBytes: gib}}}
	err = m2.EnsureDaemon(t.Context(), noUUID)
	if err == nil || !strings.Contains(err.Error(), "set_default_device_pinned_mem_limit 1 1024M") {
		t.Fatalf("error %v, want the refused second limit named", err)
	}
	if !slices.Contains(ctl2.envs[0], "CUDA_VISIBLE_DEVICES=0,1") {
		t.Errorf("control env %q", ctl2.envs[0])
	}
	if !slices.Contains(ctl2.commands, "quit") {
		t.Errorf("daemon not stopped after the refused limit: commands %q", ctl2.commands)
	}
	if _, err := os.Stat(m2.Dirs(noUUID).Pipe); !os.IsNotExist(err) {
		t.Errorf("pipe directory left behind: %v", err)
	}
}
