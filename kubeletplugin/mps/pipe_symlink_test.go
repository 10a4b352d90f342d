package mps

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// naiveControlClient plays an nvidia-cuda-mps-control client that opens
// <pipe directory>/control for writing and writes its command there,
// following symlinks as open(2) does (the real client's behaviour is not
// documented; this is the worst case).
func naiveControlClient(_ context.Context, _ string, _, env []string, stdin string) ([]byte, error) {
	var pipe string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY="); ok {
			pipe = v
		}
	}
	f, err := os.OpenFile(filepath.Join(pipe, "control"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	_, err = f.WriteString(stdin)
	return nil, err
}

// A container of an MPS claim can write the claim's pipe directory (MPS
// clients need it) and so plant a symlink there. The plugin runs the
// control client as root against that directory every
// --mps-limit-interval: it must not run it while a symlink is there, so
// that root never writes through one into a host file. The plugin's own
// file operations on the directories (create, remove) never follow one.
func TestMPSControlRefusesPlantedSymlink(t *testing.T) {
	ctl := &fakeControl{up: true}
	d, _ := newTestPodDaemon(t, fake.NewClientset(), ctl)
	d.cfg.Run = naiveControlClient
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "c1", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10}
	dirs := m.Dirs(share)
	if err := dirs.create(); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "shadow")
	const content = "root:*:19000:0:99999:7:::\n"
	if err := os.WriteFile(host, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(dirs.Pipe, "control")); err != nil {
		t.Fatal(err)
	}
	unchanged := func(when string) {
		t.Helper()
		b, err := os.ReadFile(host)
		if err != nil {
			t.Fatalf("%s: host file: %v", when, err)
		}
		if string(b) != content {
			t.Fatalf("%s: root wrote through the planted symlink into the host file: %q", when, b)
		}
		fi, err := os.Stat(host)
		if err != nil || fi.Mode().Perm() != 0o640 {
			t.Fatalf("%s: host file mode %v (%v), want 0640", when, fi.Mode(), err)
		}
	}
	if err := d.ReassertLimits(t.Context(), share, dirs); err == nil || !strings.Contains(err.Error(), `holds a symlink "control"`) {
		t.Errorf("ReassertLimits with a planted symlink: %v, want a refusal naming it", err)
	}
	unchanged("after setting the limits again")
	if _, err := d.control(t.Context(), share, dirs, "get_server_list"); err == nil {
		t.Error("control command ran with a planted symlink")
	}
	unchanged("after a control command")
	// Creating the directories again (a restart's adoption) and removing
	// them (unprepare) leave the symlink's target alone.
	if err := dirs.create(); err != nil {
		t.Fatal(err)
	}
	unchanged("after creating the directories again")
	if err := dirs.remove(); err != nil {
		t.Fatal(err)
	}
	unchanged("after removing the directories")
	// Without the symlink, the client runs.
	if err := dirs.create(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.control(t.Context(), share, dirs, "get_server_list"); err != nil {
		t.Errorf("control command without a symlink: %v", err)
	}
}
