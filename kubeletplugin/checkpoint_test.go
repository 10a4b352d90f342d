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
			{Request: "g", Pool: "node", Device: "gpu-0", Index: 0, Minor: 0, UUID: "GPU-x"},
			{Request: "s", Pool: "node", Device: "gpu-1", Index: 1, Minor: 1, ShareID: &share,
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
		"unknown version": {
			`{"checksum":"` + checksum([]byte(`{"version":"v0","bootID":"b","claims":{}}`)) + `","data":{"version":"v0","bootID":"b","claims":{}}}`,
			`version "v0"`,
		},
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
