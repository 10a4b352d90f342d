package mps_test

import (
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/gpulink/gpulink/kubeletplugin/mps/mpstest"
)

const gib = int64(1) << 30

func TestMPSManagerRefcount(t *testing.T) {
	ctx := t.Context()
	daemon := mpstest.NewFakeDaemon()
	m := mps.NewManager("/run/mps", daemon)
	a := mps.Share{Claim: "claim-a", GPUs: []mps.Device{{GPU: mps.GPU{Index: 0, UUID: "GPU-a"}, MemoryBytes: gib}}, Cores: 10}
	b := mps.Share{Claim: "claim-b", GPUs: []mps.Device{{GPU: mps.GPU{Index: 0, UUID: "GPU-a"}, MemoryBytes: 2 * gib}}, Cores: 20}

	for range 3 {
		if err := m.EnsureDaemon(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.EnsureDaemon(ctx, b); err != nil {
		t.Fatal(err)
	}
	// Two claims on one GPU: two daemons, each with its own limits.
	if daemon.Starts["claim-a"] != 1 || daemon.Starts["claim-b"] != 1 || !reflect.DeepEqual(daemon.Shares["claim-b"], b) {
		t.Fatalf("starts %v shares %v, want one per claim", daemon.Starts, daemon.Shares)
	}
	if got := m.Dirs(a); got != (mps.Dirs{Base: "/run/mps/claim-a", Pipe: "/run/mps/claim-a/pipe", Log: "/run/mps/claim-a/log", Shm: "/run/mps/claim-a/shm"}) {
		t.Errorf("dirs %+v", got)
	}
	for i := range 2 {
		if err := m.ReleaseDaemon(ctx, a); err != nil {
			t.Fatal(err)
		}
		if !daemon.IsRunning("claim-a") {
			t.Fatalf("daemon stopped after release %d of 3", i+1)
		}
	}
	if err := m.ReleaseDaemon(ctx, a); err != nil {
		t.Fatal(err)
	}
	if daemon.IsRunning("claim-a") || daemon.Stops["claim-a"] != 1 || !daemon.IsRunning("claim-b") {
		t.Fatalf("after last release of a: running %v, stops %v", daemon.Running, daemon.Stops)
	}
	if err := m.ReleaseDaemon(ctx, a); err == nil {
		t.Error("releasing without a reference succeeded")
	}
	// A failed start holds no reference.
	daemon.StartErr = errors.New("boom")
	if err := m.EnsureDaemon(ctx, a); err == nil || !strings.Contains(err.Error(), "claim-a") || !strings.Contains(err.Error(), "GPU-a") {
		t.Fatalf("error %v", err)
	}
	daemon.StartErr = nil
	if err := m.ReleaseDaemon(ctx, a); err == nil {
		t.Error("failed start left a reference")
	}
	if err := m.EnsureDaemon(ctx, mps.Share{GPUs: []mps.Device{{GPU: mps.GPU{Index: 1}}}}); err == nil {
		t.Error("a share without a claim UID started a daemon")
	}
}

func TestMPSManagerConcurrent(t *testing.T) {
	ctx := t.Context()
	daemon := mpstest.NewFakeDaemon()
	m := mps.NewManager(t.TempDir(), daemon)
	s := mps.Share{Claim: "c", GPUs: []mps.Device{{GPU: mps.GPU{Index: 0, UUID: "GPU-c"}, MemoryBytes: gib}}, Cores: 10}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if err := m.EnsureDaemon(ctx, s); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for range 16 {
		wg.Go(func() {
			if err := m.ReleaseDaemon(ctx, s); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if daemon.Starts["c"] != 1 || daemon.Stops["c"] != 1 {
		t.Errorf("starts %d stops %d, want 1 and 1", daemon.Starts["c"], daemon.Stops["c"])
	}
}

// Concurrent shares reference their group's daemon on their GPU: claims of
// one group on one GPU share a daemon, which stops with the last of their
// references; another group, or the same group on another GPU, has a
// daemon of its own. A Concurrent share on two GPUs is refused.
func TestMPSManagerGroupRefcount(t *testing.T) {
	ctx := t.Context()
	daemon := mpstest.NewFakeDaemon()
	m := mps.NewManager("/run/mps", daemon)
	gpu := func(i int) mps.Device {
		return mps.Device{GPU: mps.GPU{Index: i, UUID: "GPU-0000000" + string(rune('0'+i)) + "-0000-0000-0000-000000000000"}, MemoryBytes: gib}
	}
	share := func(claim, group string, dev mps.Device) mps.Share {
		return mps.Share{Claim: types.UID(claim), Group: group, GPUs: []mps.Device{dev}, Cores: 10}
	}
	a := share("claim-a", "team-a", gpu(0))
	b := share("claim-b", "team-a", gpu(0))
	c := share("claim-c", "team-b", gpu(0))
	d := share("claim-d", "team-a", gpu(1))
	id := a.ID()
	if id != "team-a-gpu-00000000-0000-0000-0000-000000000000" || b.ID() != id || c.ID() == id || d.ID() == id {
		t.Fatalf("IDs a %s b %s c %s d %s", a.ID(), b.ID(), c.ID(), d.ID())
	}
	// a holds two references (two results on the GPU), b one.
	for _, s := range []mps.Share{a, a, b, c, d} {
		if err := m.EnsureDaemon(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if len(daemon.Starts) != 3 || daemon.Starts[id] != 1 || daemon.Starts[c.ID()] != 1 || daemon.Starts[d.ID()] != 1 {
		t.Fatalf("starts %v, want one per group and GPU", daemon.Starts)
	}
	if got := m.Dirs(b); got.Base != "/run/mps/"+id {
		t.Errorf("dirs of b %+v, want the group's", got)
	}
	for _, s := range []mps.Share{a, a} {
		if err := m.ReleaseDaemon(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if !daemon.IsRunning(id) || daemon.Stops[id] != 0 {
		t.Fatal("the group's daemon stopped while claim b still references it")
	}
	if err := m.ReleaseDaemon(ctx, b); err != nil {
		t.Fatal(err)
	}
	if daemon.IsRunning(id) || daemon.Stops[id] != 1 || !daemon.IsRunning(c.ID()) || !daemon.IsRunning(d.ID()) {
		t.Fatalf("after the group's last release on GPU 0: running %v stops %v", daemon.Running, daemon.Stops)
	}
	if err := m.ReleaseDaemon(ctx, b); err == nil {
		t.Error("releasing a group's daemon without a reference succeeded")
	}
	two := a
	two.GPUs = []mps.Device{gpu(0), gpu(1)}
	if err := m.EnsureDaemon(ctx, two); err == nil || !strings.Contains(err.Error(), "one GPU") {
		t.Errorf("Concurrent share on two GPUs: %v", err)
	}
}
