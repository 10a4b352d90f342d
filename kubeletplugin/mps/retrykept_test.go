package mps

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// blockingDaemon fails its first Start as kept (ErrDaemonKept), then
// blocks every Start until release is closed, and counts stops.
type blockingDaemon struct {
	mu      sync.Mutex
	starts  int
	stops   int
	started chan struct{}
	release chan struct{}
}

func (b *blockingDaemon) Start(context.Context, Share, Dirs) error {
	b.mu.Lock()
	b.starts++
	n := b.starts
	b.mu.Unlock()
	if n == 1 {
		return fmt.Errorf("no definite answer: %w", ErrDaemonKept)
	}
	close(b.started)
	<-b.release
	return nil
}

func (b *blockingDaemon) Stop(context.Context, Share, Dirs) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stops++
	return nil
}

// RetryKept starts kept daemons outside the manager's lock: a claim's
// unprepare (or another prepare) does not wait for a retry that waits for
// a daemon. A daemon whose last reference went meanwhile is stopped once
// the retry's start returns, so the retry leaves no daemon nobody needs.
func TestMPSManagerRetryKeptDoesNotBlockRelease(t *testing.T) {
	b := &blockingDaemon{started: make(chan struct{}), release: make(chan struct{})}
	m := NewManager(t.TempDir(), b)
	share := Share{Claim: "c1", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10}
	if err := m.EnsureDaemon(t.Context(), share); !errors.Is(err, ErrDaemonKept) {
		t.Fatalf("EnsureDaemon: %v, want kept", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.RetryKept(t.Context())
		done <- err
	}()
	<-b.started
	// The retry's start is waiting; the claim's unprepare goes through.
	if err := m.ReleaseDaemon(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	close(b.release)
	if err := <-done; err != nil {
		t.Errorf("RetryKept: %v", err)
	}
	b.mu.Lock()
	stops := b.stops
	b.mu.Unlock()
	if stops != 2 {
		t.Errorf("%d stops, want 2: the release's, and the retry's of the daemon it started for nobody", stops)
	}
	if n := m.(*mpsManager).Daemons(); n != 0 {
		t.Errorf("%d daemons referenced", n)
	}
}
