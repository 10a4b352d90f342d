package kubeletplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestMPSManagerRefcount(t *testing.T) {
	ctx := t.Context()
	daemon := newFakeDaemon()
	m := NewMPSManager("/run/mps", daemon)
	a := MPSGPU{Index: 0, UUID: "GPU-a"}
	b := MPSGPU{Index: 1} // UUID unknown: named by device name

	for range 3 {
		if err := m.EnsureDaemon(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.EnsureDaemon(ctx, b); err != nil {
		t.Fatal(err)
	}
	if daemon.starts["GPU-a"] != 1 || daemon.starts["gpu-1"] != 1 {
		t.Fatalf("starts %v, want one per GPU", daemon.starts)
	}
	if got := m.Dirs(a); got.Pipe != "/run/mps/GPU-a/pipe" || got.Log != "/run/mps/GPU-a/log" {
		t.Errorf("dirs %+v", got)
	}
	for i := range 2 {
		if err := m.ReleaseDaemon(ctx, a); err != nil {
			t.Fatal(err)
		}
		if !daemon.isRunning("GPU-a") {
			t.Fatalf("daemon stopped after release %d of 3", i+1)
		}
	}
	if err := m.ReleaseDaemon(ctx, a); err != nil {
		t.Fatal(err)
	}
	if daemon.isRunning("GPU-a") || daemon.stops["GPU-a"] != 1 {
		t.Fatalf("daemon running %v, stops %d after last release", daemon.isRunning("GPU-a"), daemon.stops["GPU-a"])
	}
	if err := m.ReleaseDaemon(ctx, a); err == nil {
		t.Error("releasing without a reference succeeded")
	}
	// A failed start holds no reference.
	daemon.startErr = errors.New("boom")
	if err := m.EnsureDaemon(ctx, a); err == nil || !strings.Contains(err.Error(), "GPU-a") {
		t.Fatalf("error %v", err)
	}
	daemon.startErr = nil
	if err := m.ReleaseDaemon(ctx, a); err == nil {
		t.Error("failed start left a reference")
	}
}

func TestMPSManagerConcurrent(t *testing.T) {
	ctx := t.Context()
	daemon := newFakeDaemon()
	m := NewMPSManager(t.TempDir(), daemon)
	g := MPSGPU{Index: 0, UUID: "GPU-c"}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if err := m.EnsureDaemon(ctx, g); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for range 16 {
		wg.Go(func() {
			if err := m.ReleaseDaemon(ctx, g); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if daemon.starts["GPU-c"] != 1 || daemon.stops["GPU-c"] != 1 {
		t.Errorf("starts %d stops %d, want 1 and 1", daemon.starts["GPU-c"], daemon.stops["GPU-c"])
	}
}

type call struct {
	name  string
	args  []string
	env   []string
	stdin string
}

func TestExecMPSDaemon(t *testing.T) {
	root := t.TempDir()
	var calls []call
	running := false
	d := &ExecMPSDaemon{Control: "/usr/bin/nvidia-cuda-mps-control", Run: func(_ context.Context, name string, args, env []string, stdin string) ([]byte, error) {
		calls = append(calls, call{name, args, env, stdin})
		switch {
		case slices.Equal(args, []string{"-d"}):
			running = true
			return nil, nil
		case stdin == "get_server_list\n":
			if running {
				return []byte("\n"), nil
			}
			return []byte("Cannot find MPS control daemon process"), errors.New("exit status 1")
		case stdin == "quit\n":
			if !running {
				return nil, errors.New("exit status 1")
			}
			running = false
			return nil, nil
		}
		return nil, errors.New("unexpected call")
	}}
	m := NewMPSManager(root, d)
	g := MPSGPU{Index: 3, UUID: "GPU-1234"}
	if err := m.EnsureDaemon(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	pipe := filepath.Join(root, "GPU-1234", "pipe")
	wantEnv := []string{"CUDA_VISIBLE_DEVICES=GPU-1234", "CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(root, "GPU-1234", "log")}
	last := calls[len(calls)-1]
	if last.name != d.Control || !slices.Equal(last.args, []string{"-d"}) || !slices.Equal(last.env, wantEnv) {
		t.Errorf("start call %+v, want %s -d with %v", last, d.Control, wantEnv)
	}
	// A restarted plugin adopts the running daemon instead of starting a
	// second one.
	m2 := NewMPSManager(root, d)
	n := len(calls)
	if err := m2.EnsureDaemon(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	for _, c := range calls[n:] {
		if slices.Equal(c.args, []string{"-d"}) {
			t.Error("started a second daemon instead of adopting the running one")
		}
	}
	if err := m2.ReleaseDaemon(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	if running {
		t.Error("daemon not stopped")
	}
	last = calls[len(calls)-1]
	if last.stdin != "quit\n" || !slices.Equal(last.env, wantEnv) {
		t.Errorf("stop call %+v", last)
	}
	// Stopping a daemon that is already gone is not an error.
	if err := d.Stop(t.Context(), g, m.Dirs(g)); err != nil {
		t.Errorf("stopping a dead daemon: %v", err)
	}
}

func TestDirOnlyMPSDaemon(t *testing.T) {
	root := t.TempDir()
	m := NewMPSManager(root, DirOnlyMPSDaemon{})
	g := MPSGPU{Index: 2}
	if err := m.EnsureDaemon(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{m.Dirs(g).Pipe, m.Dirs(g).Log} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("%s not created: %v", dir, err)
		}
	}
	if m.Dirs(g).Pipe != filepath.Join(root, "gpu-2", "pipe") {
		t.Errorf("pipe dir %s", m.Dirs(g).Pipe)
	}
	if err := m.ReleaseDaemon(t.Context(), g); err != nil {
		t.Fatal(err)
	}
}
