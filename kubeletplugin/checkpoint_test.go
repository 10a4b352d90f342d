package kubeletplugin

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

func testLogger(t *testing.T) klog.Logger {
	logger, _ := ktesting.NewTestContext(t)
	return logger
}

func TestCheckpointRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := NewCheckpointStore(dir)
	empty, err := s.Load()
	if err != nil || len(empty.Claims) != 0 {
		t.Fatalf("loading a missing checkpoint: %+v, %v", empty, err)
	}
	share := types.UID("7b1d0e7e-aaaa-4bbb-8ccc-ddddeeeeffff")
	cp := newCheckpoint("boot")
	cp.Claims["u1"] = &PreparedClaim{
		UID: "u1", Namespace: "ns", Name: "c", State: PrepareCompleted, CDIDeviceID: CDIDeviceID("u1"),
		Devices: []PreparedDevice{
			{Request: "g", Pool: "node", Device: "gpu-0", Index: 0, Minor: 0, UUID: "GPU-x", CDIDeviceID: CDIDeviceIDForDevice("u1", "gpu-0")},
			{Request: "s", Pool: "node", Device: "gpu-1", Index: 1, Minor: 1, ShareID: &share, CDIDeviceID: CDIDeviceIDForDevice("u1", "gpu-1"),
				Share: &PreparedShare{MemoryBytes: 1 << 30, Cores: 20, Strategy: apiv1alpha1.SharingMPS, MPSRef: true}},
		},
	}
	if err := s.Store(cp); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cp) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, cp)
	}
	// No temporary files left behind.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the checkpoint", len(entries))
	}
}

func TestCheckpointCorruption(t *testing.T) {
	for name, tc := range map[string]struct {
		content string
		want    string
	}{
		"not JSON":          {`garbage`, "corrupt checkpoint"},
		"truncated":         {`{"checksum":"sha256:00","data":{"vers`, "corrupt checkpoint"},
		"no data":           {`{"checksum":"x"}`, "no data"},
		"checksum mismatch": {`{"checksum":"sha256:00","data":{"version":"gpulink.kubeletplugin/v1","bootID":"b","claims":{}}}`, "does not match"},
		// Load is strict (a rolling update's other instance may be newer);
		// the start tolerates it (TestRestartAfterRollbackKeepsClaims).
		"unknown field": {
			`{"checksum":"` + checksum([]byte(`{"version":"gpulink.kubeletplugin/v1","bogus":1}`)) + `","data":{"version":"gpulink.kubeletplugin/v1","bogus":1}}`,
			"bogus",
		},
		"entry under the wrong UID": {
			`{"checksum":"` + checksum([]byte(`{"version":"gpulink.kubeletplugin/v1","bootID":"b","claims":{"a":{"uid":"b"}}}`)) + `","data":{"version":"gpulink.kubeletplugin/v1","bootID":"b","claims":{"a":{"uid":"b"}}}}`,
			`entry "a"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := NewCheckpointStore(dir)
			if err := os.WriteFile(s.Path(), []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := s.Load()
			if !errors.Is(err, ErrCorruptCheckpoint) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), s.Path()) {
				t.Fatalf("error %v, want ErrCorruptCheckpoint naming the file and %q", err, tc.want)
			}
			moved, err := s.MoveAside()
			if err != nil {
				t.Fatal(err)
			}
			if moved != filepath.Join(dir, CheckpointFile+".corrupt") {
				t.Errorf("moved to %s", moved)
			}
			if _, err := os.Stat(s.Path()); !os.IsNotExist(err) {
				t.Errorf("checkpoint still in place: %v", err)
			}
		})
	}
}

func TestFileBootID(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(p, []byte("0f1e2d3c-aaaa\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := FileBootID(p)()
	if err != nil || id != "0f1e2d3c-aaaa" {
		t.Errorf("boot ID %q, %v", id, err)
	}
	if err := os.WriteFile(p, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := FileBootID(p)(); err == nil {
		t.Error("empty boot ID accepted")
	}
	if _, err := FileBootID(filepath.Join(dir, "missing"))(); err == nil {
		t.Error("missing boot ID file accepted")
	}
}

// The checkpoint records MPS shares per result; the daemon's share (its
// GPUs and limits) is derived from them, so a checkpoint written before
// daemons served several GPUs loads unchanged and gives the one-GPU share
// it was started with, and a two-GPU claim round-trips to a two-GPU share.
func TestCheckpointMPSSharesOldAndNew(t *testing.T) {
	dir := t.TempDir()
	// A claim with one MPS share, as an earlier plugin wrote it.
	data := `{"version":"gpulink.kubeletplugin/v1","bootID":"b","claims":{"old":{"uid":"old","namespace":"ns","name":"c","state":"PrepareCompleted","cdiDeviceID":"gpu.gpulink.dev/claim=old",` +
		`"devices":[{"request":"s","pool":"node","device":"gpu-1","index":1,"minor":1,"uuid":"GPU-1","share":{"memoryBytes":1073741824,"cores":20,"strategy":"MPS","mpsRef":true}}]}}}`
	raw := `{"checksum":"` + checksum([]byte(data)) + `","data":` + data + `}`
	if err := os.WriteFile(filepath.Join(dir, CheckpointFile), []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	s := NewCheckpointStore(dir)
	cp, err := s.Load()
	if err != nil {
		t.Fatalf("loading an old checkpoint: %v", err)
	}
	old := cp.Claims["old"]
	if old == nil {
		t.Fatalf("old claim missing: %+v", cp.Claims)
	}
	wantOld := mps.Share{Claim: "old", Cores: 20, GPUs: []mps.Device{{GPU: mps.GPU{Index: 1, UUID: "GPU-1"}, MemoryBytes: 1 << 30}}}
	if got := old.mpsShare(); !reflect.DeepEqual(got, wantOld) {
		t.Errorf("old claim's share %+v, want %+v", got, wantOld)
	}

	mpsResult := func(index int, mem int64) PreparedDevice {
		return PreparedDevice{Request: "s", Pool: "node", Device: "gpu-" + string(rune('0'+index)), Index: index, Minor: index, UUID: "GPU-" + string(rune('0'+index)),
			Share: &PreparedShare{MemoryBytes: mem, Cores: 40, Strategy: apiv1alpha1.SharingMPS, MPSRef: true}}
	}
	cp.Claims["new"] = &PreparedClaim{UID: "new", Namespace: "ns", Name: "d", State: PrepareCompleted, CDIDeviceID: CDIDeviceID("new"),
		Devices: []PreparedDevice{mpsResult(2, 2<<30), mpsResult(0, 3<<30)}}
	if err := s.Store(cp); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cp) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, cp)
	}
	wantNew := mps.Share{Claim: "new", Cores: 40, GPUs: []mps.Device{
		{GPU: mps.GPU{Index: 0, UUID: "GPU-0"}, MemoryBytes: 3 << 30},
		{GPU: mps.GPU{Index: 2, UUID: "GPU-2"}, MemoryBytes: 2 << 30},
	}}
	if share := got.Claims["new"].mpsShare(); !reflect.DeepEqual(share, wantNew) {
		t.Errorf("two-GPU claim's share %+v, want %+v", share, wantNew)
	}
	if share := got.Claims["old"].mpsShare(); !reflect.DeepEqual(share, wantOld) {
		t.Errorf("old claim's share after a rewrite %+v, want %+v", share, wantOld)
	}
}
