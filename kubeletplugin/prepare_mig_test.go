package kubeletplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology/topologytest"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpulink/gpulink/driver"
)

func migResult(request, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver.Name, Pool: testNode, Device: device}
}

// migEnv is an env on a simulated DGX A100 40GB with GPU 0 split into a
// 1g.5gb and a 3g.20gb instance and GPU 1 into one 7g.40gb, and the
// instances' capability nodes in the driver root.
func migEnv(t *testing.T) *env {
	topo := topologytest.MIG(t, map[int][]string{0: {"1g.5gb", "3g.20gb"}, 1: {"7g.40gb"}})
	e := newEnv(t, topo)
	caps := filepath.Join(e.driverRoot, "dev", "nvidia-caps")
	if err := os.MkdirAll(caps, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, g := range topo.GPUs[:2] {
		for _, in := range g.MIG.Instances {
			for _, m := range []int{in.GICapMinor, in.CICapMinor} {
				if err := os.Symlink("/dev/null", filepath.Join(caps, fmt.Sprintf("nvidia-cap%d", m))); err != nil && !os.IsExist(err) {
					t.Fatal(err)
				}
			}
		}
	}
	return e
}

func readSpec(t *testing.T, e *env, uid types.UID) cdispec.Spec {
	t.Helper()
	data, err := os.ReadFile(e.specPath(uid))
	if err != nil {
		t.Fatal(err)
	}
	var s cdispec.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPrepareMIGDevices(t *testing.T) {
	e := migEnv(t)
	d := e.start()
	gpu0 := e.disc.topo.GPUs[0]
	small, large := gpu0.MIG.Instances[0], gpu0.MIG.Instances[1]
	c := newClaim("mig", []resourceapi.DeviceRequestAllocationResult{
		migResult("small", "gpu-0-mig-0-0"), migResult("large", "gpu-0-mig-1-0"),
	})
	devs := mustPrepare(t, d, c)
	if len(devs) != 2 || devs[0].DeviceName != "gpu-0-mig-0-0" || devs[1].DeviceName != "gpu-0-mig-1-0" {
		t.Fatalf("devices %+v", devs)
	}
	if devs[0].CDIDeviceIDs[0] == devs[1].CDIDeviceIDs[0] {
		t.Errorf("two MIG devices of one GPU share CDI device %s", devs[0].CDIDeviceIDs[0])
	}
	spec := readSpec(t, e, c.UID)
	byName := map[string]cdispec.ContainerEdits{}
	for _, dev := range spec.Devices {
		byName[dev.Name] = dev.ContainerEdits
	}
	for k, in := range []struct {
		name   string
		gi, ci int
	}{{"gpu-0-mig-0-0", small.GICapMinor, small.CICapMinor}, {"gpu-0-mig-1-0", large.GICapMinor, large.CICapMinor}} {
		edits, ok := byName[cdiGPUDeviceName(c.UID, in.name)]
		if !ok {
			t.Fatalf("spec has no device for %s: %+v", in.name, spec.Devices)
		}
		var paths []string
		for _, n := range edits.DeviceNodes {
			paths = append(paths, n.Path)
		}
		want := []string{"/dev/nvidia0", fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", in.gi), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", in.ci)}
		if !slices.Equal(paths, want) {
			t.Errorf("%s: device nodes %v, want %v", in.name, paths, want)
		}
		if env := fmt.Sprintf("GPULINK_DEVICE_%d=%s", k, in.name); !slices.Contains(edits.Env, env) {
			t.Errorf("%s: env %v, want %s", in.name, edits.Env, env)
		}
	}
	claimEnv := byName[string(c.UID)].Env
	want := "NVIDIA_VISIBLE_DEVICES=" + small.UUID + "," + large.UUID
	if !slices.Contains(claimEnv, want) {
		t.Errorf("claim env %v, want %s", claimEnv, want)
	}
	if strings.Contains(strings.Join(claimEnv, " "), gpu0.UUID) {
		t.Errorf("claim env %v names the parent GPU %s: the container would get all of it", claimEnv, gpu0.UUID)
	}
	pc := readCheckpoint(t, e).Claims[c.UID]
	if pc == nil || len(pc.Devices) != 2 || pc.Devices[1].MIG == nil || pc.Devices[1].MIG.Profile != "3g.20gb" || pc.Devices[1].UUID != large.UUID {
		t.Fatalf("checkpoint entry %+v, want both MIG devices", pc)
	}

	// A restarted plugin answers from the checkpoint, and still refuses
	// the same MIG device to another claim.
	d = e.start()
	if again := mustPrepare(t, d, c); len(again) != 2 {
		t.Errorf("after restart: %+v", again)
	}
	other := newClaim("other", []resourceapi.DeviceRequestAllocationResult{migResult("gpus", "gpu-0-mig-1-0")})
	err := prepare(t, d, other)[other.UID].Err
	if err == nil || !strings.Contains(err.Error(), `MIG device "gpu-0-mig-1-0" is already prepared for another claim`) {
		t.Errorf("second claim on one MIG device: %v", err)
	}
	mustUnprepare(t, d, c)
	if e.specExists(c.UID) {
		t.Error("CDI spec left after unprepare")
	}
	mustPrepare(t, d, other)
}

func TestPrepareMIGRefusesBadResults(t *testing.T) {
	e := migEnv(t)
	d := e.start()
	share := migResult("gpus", "gpu-1-mig-0-0")
	id := types.UID("s1")
	share.ShareID = &id
	for _, c := range []struct {
		results []resourceapi.DeviceRequestAllocationResult
		want    string
	}{
		{[]resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 0)}, `results[0].device: "gpu-0": GPU 0 is in MIG mode on node ` + testNode},
		{[]resourceapi.DeviceRequestAllocationResult{shareOf("gpus", 1, "1Gi", 10)}, `"gpu-1": GPU 1 is in MIG mode`},
		{[]resourceapi.DeviceRequestAllocationResult{migResult("gpus", "gpu-2-mig-0-0")}, `results[0].device: "gpu-2-mig-0-0": GPU 2 is not in MIG mode`},
		{[]resourceapi.DeviceRequestAllocationResult{migResult("gpus", "gpu-0-mig-5-0")}, `"gpu-0-mig-5-0": GPU 0 on node ` + testNode + ` has no compute instance 0 in GPU instance 5 (it has: gpu-0-mig-0-0 (1g.5gb), gpu-0-mig-1-0 (3g.20gb))`},
		{[]resourceapi.DeviceRequestAllocationResult{migResult("gpus", "gpu-9-mig-0-0")}, "no GPU with index 9"},
		{[]resourceapi.DeviceRequestAllocationResult{migResult("gpus", "gpu-0-mig-x-0")}, "results[0].device: device name"},
		{[]resourceapi.DeviceRequestAllocationResult{share}, `results[0].shareID: s1: MIG device "gpu-1-mig-0-0" (profile 7g.40gb) is given out whole`},
		{[]resourceapi.DeviceRequestAllocationResult{migResult("a", "gpu-1-mig-0-0"), migResult("b", "gpu-1-mig-0-0")}, `results[1].device: MIG device "gpu-1-mig-0-0" is allocated twice`},
	} {
		claim := newClaim("bad", c.results)
		err := prepare(t, d, claim)[claim.UID].Err
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("results %v: got %v, want an error containing %q", c.results, err, c.want)
		}
		if e.specExists(claim.UID) {
			t.Errorf("results %v: a refused claim left a CDI spec", c.results)
		}
	}
}
