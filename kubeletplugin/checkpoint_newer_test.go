package kubeletplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
)

// rewriteCheckpoint applies edit to the checkpoint's data as generic JSON
// and stores it with a matching checksum, as another plugin version
// would have written it.
func rewriteCheckpoint(t *testing.T, path string, edit func(data map[string]any)) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f checkpointFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	var data map[string]any
	if err := json.Unmarshal(f.Data, &data); err != nil {
		t.Fatal(err)
	}
	edit(data)
	if f.Data, err = json.Marshal(data); err != nil {
		t.Fatal(err)
	}
	f.Checksum = checksum(f.Data)
	if raw, err = json.Marshal(f); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return raw
}

// preparedForRollback prepares a whole GPU and an MPS share, as a newer
// plugin version would have before a rollback.
func preparedForRollback(t *testing.T) (*env, []*resourceapi.ResourceClaim) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	whole := newClaim("whole", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)})
	share := newClaim("mps", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "2Gi", 20)},
		opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("MPS")))
	mustPrepare(t, d, whole)
	mustPrepare(t, d, share)
	return e, []*resourceapi.ResourceClaim{whole, share}
}

// A rollback of the chart starts an older plugin on a checkpoint a newer
// one wrote. Fields it does not know must not make the checkpoint
// "corrupt": that tore down every running pod's CDI spec and MPS daemon.
// The claims are kept, a copy of the file too.
func TestRestartAfterRollbackKeepsClaims(t *testing.T) {
	e, claims := preparedForRollback(t)
	path := NewCheckpointStore(e.pluginDir).Path()
	newer := rewriteCheckpoint(t, path, func(data map[string]any) {
		data["nodeFeatures"] = []string{"something-new"}
		for _, c := range data["claims"].(map[string]any) {
			claim := c.(map[string]any)
			claim["preparedBy"] = "gpulink v9"
			for _, dev := range claim["devices"].([]any) {
				dev.(map[string]any)["numaPinning"] = map[string]any{"node": 0}
			}
		}
	})
	stops := len(e.daemon.Stops)

	d := e.start()
	for _, c := range claims {
		if !e.specExists(c.UID) {
			t.Errorf("claim %s: CDI spec removed after a rollback", c.Name)
		}
		if d.cp.Claims[c.UID] == nil {
			t.Errorf("claim %s: forgotten after a rollback", c.Name)
		}
	}
	if len(e.daemon.Stops) != stops {
		t.Errorf("MPS daemons stopped after a rollback: %v", e.daemon.Stops)
	}
	if _, err := os.Stat(path + ".corrupt"); err == nil {
		t.Error("the newer version's checkpoint was moved aside as corrupt")
	}
	if kept, err := os.ReadFile(path + newerCheckpointSuffix); err != nil || !bytes.Equal(kept, newer) {
		t.Errorf("no copy of the newer version's checkpoint kept (%v)", err)
	}
	// Still served: the kubelet gets the claims from the checkpoint, and
	// unprepares them when their pods end.
	for _, c := range claims {
		if devs := mustPrepare(t, d, c); len(devs) != 1 {
			t.Errorf("claim %s answered with %+v", c.Name, devs)
		}
		mustUnprepare(t, d, c)
	}
}

// A checkpoint of a newer format version cannot be interpreted at all:
// the plugin refuses to start and touches nothing (file, CDI specs, MPS
// daemons), rather than tear down what running pods use.
func TestRestartOnNewerCheckpointVersionTouchesNothing(t *testing.T) {
	e, claims := preparedForRollback(t)
	path := NewCheckpointStore(e.pluginDir).Path()
	newer := rewriteCheckpoint(t, path, func(data map[string]any) {
		data["version"] = "gpulink.kubeletplugin/v2"
		data["claims"] = map[string]any{"reshaped": true}
	})
	stops := len(e.daemon.Stops)
	_, err := e.newDriver()
	if err == nil || !errors.Is(err, ErrCheckpointVersion) || !strings.Contains(err.Error(), `version "gpulink.kubeletplugin/v2"`) {
		t.Fatalf("New: %v, want a refusal naming the checkpoint's version", err)
	}
	if raw, err := os.ReadFile(path); err != nil || !bytes.Equal(raw, newer) {
		t.Errorf("the newer checkpoint was changed or moved (%v)", err)
	}
	for _, c := range claims {
		if !e.specExists(c.UID) {
			t.Errorf("claim %s: CDI spec removed", c.Name)
		}
	}
	if len(e.daemon.Stops) != stops {
		t.Errorf("MPS daemons stopped: %v", e.daemon.Stops)
	}
}
