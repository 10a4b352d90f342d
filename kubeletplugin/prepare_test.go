package kubeletplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

func prepare(t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]draplugin.PrepareResult {
	t.Helper()
	res, err := d.PrepareResourceClaims(t.Context(), claims)
	if err != nil {
		t.Fatalf("PrepareResourceClaims: %v", err)
	}
	if len(res) != len(claims) {
		t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	return res
}

func unprepare(t *testing.T, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]error {
	t.Helper()
	objs := make([]draplugin.NamespacedObject, 0, len(claims))
	for _, c := range claims {
		objs = append(objs, draplugin.NamespacedObject{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
	}
	res, err := d.UnprepareResourceClaims(t.Context(), objs)
	if err != nil {
		t.Fatalf("UnprepareResourceClaims: %v", err)
	}
	if len(res) != len(claims) {
		t.Fatalf("%d results for %d claims", len(res), len(claims))
	}
	return res
}

func mustPrepare(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) []draplugin.Device {
	t.Helper()
	r := prepare(t, d, c)[c.UID]
	if r.Err != nil {
		t.Fatalf("prepare %s: %v", c.Name, r.Err)
	}
	return r.Devices
}

func mustUnprepare(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) {
	t.Helper()
	if err := unprepare(t, d, c)[c.UID]; err != nil {
		t.Fatalf("unprepare %s: %v", c.Name, err)
	}
}

func readCheckpoint(t *testing.T, e *env) *Checkpoint {
	t.Helper()
	cp, err := NewCheckpointStore(e.pluginDir).Load()
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func TestPrepareWholeGPUsIdempotent(t *testing.T) {
	e := newEnv(t, loadTopology(t, "v100-sxm2-8-aliyun-sccgn6.txt"))
	d := e.start()
	c := newClaim("train", []resourceapi.DeviceRequestAllocationResult{
		wholeGPU("gpus", 0), wholeGPU("gpus", 3),
		// Another driver's result is not ours to prepare.
		{Request: "nic", Driver: "nic.example.com", Pool: testNode, Device: "eth0"},
	})
	devs := mustPrepare(t, d, c)
	if len(devs) != 2 {
		t.Fatalf("devices %+v, want 2", devs)
	}
	// Each GPU's own CDI device first (the kubelet names the device by
	// it in allocatedResourcesStatus), then the claim's.
	wantID := "gpu.gpulink.dev/claim=" + string(c.UID)
	for i, dev := range devs {
		name := driver.DeviceName([]int{0, 3}[i])
		if dev.PoolName != testNode || dev.DeviceName != name ||
			len(dev.Requests) != 1 || dev.Requests[0] != "gpus" || !slices.Equal(dev.CDIDeviceIDs, []string{wantID + "-" + name, wantID}) {
			t.Errorf("device %d: %+v", i, dev)
		}
	}
	if !e.specExists(c.UID) {
		t.Fatal("no CDI spec written")
	}
	if got := readCheckpoint(t, e).Claims[c.UID]; got == nil || got.State != PrepareCompleted {
		t.Fatalf("checkpoint entry %+v, want PrepareCompleted", got)
	}
	before, err := os.ReadFile(e.specPath(c.UID))
	if err != nil {
		t.Fatal(err)
	}
	// Preparing again answers from the checkpoint with the same devices.
	again := mustPrepare(t, d, c)
	if !reflect.DeepEqual(again, devs) {
		t.Errorf("second prepare %+v, want %+v", again, devs)
	}
	after, _ := os.ReadFile(e.specPath(c.UID))
	if string(before) != string(after) {
		t.Errorf("second prepare rewrote the spec")
	}

	mustUnprepare(t, d, c)
	if e.specExists(c.UID) {
		t.Error("CDI spec left after unprepare")
	}
	if n := len(readCheckpoint(t, e).Claims); n != 0 {
		t.Errorf("%d checkpoint entries after unprepare", n)
	}
	// Unpreparing again (kubelet retry) is fine.
	mustUnprepare(t, d, c)
}

func TestPrepareSharesAndMPSRefcount(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	gpu1 := "GPU-00000001-0000-0000-0000-000000000000"
	a := newClaim("a", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "4Gi", 30)})
	b := newClaim("b", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "2Gi", 20)})
	mustPrepare(t, d, a)
	devs := mustPrepare(t, d, b)
	if devs[0].ShareID == nil {
		t.Errorf("share ID not passed to the kubelet: %+v", devs[0])
	}
	// One daemon per claim, each started once with its claim's limits on
	// GPU 1.
	for uid, want := range map[types.UID]mps.Share{
		a.UID: {Claim: a.UID, GPUs: []mps.Device{{GPU: mps.GPU{Index: 1, UUID: gpu1}, MemoryBytes: 4 * gib}}, Cores: 30},
		b.UID: {Claim: b.UID, GPUs: []mps.Device{{GPU: mps.GPU{Index: 1, UUID: gpu1}, MemoryBytes: 2 * gib}}, Cores: 20},
	} {
		if n := e.daemon.Starts[string(uid)]; n != 1 || !e.daemon.IsRunning(string(uid)) || !reflect.DeepEqual(e.daemon.Shares[string(uid)], want) {
			t.Fatalf("daemon of %s started %d times, running %v, share %+v; want once, running, %+v", uid, n, e.daemon.IsRunning(string(uid)), e.daemon.Shares[string(uid)], want)
		}
	}
	share := readCheckpoint(t, e).Claims[a.UID].Devices[0].Share
	if share == nil || share.MemoryBytes != 4*gib || share.Cores != 30 || share.Strategy != "MPS" || !share.MPSRef {
		t.Errorf("checkpointed share %+v", share)
	}
	if n := testutil.ToFloat64(d.metrics.MPSDaemons); n != 2 {
		t.Errorf("mps_daemons = %v with two MPS claims, want 2", n)
	}
	mustUnprepare(t, d, a)
	if e.daemon.IsRunning(string(a.UID)) || !e.daemon.IsRunning(string(b.UID)) {
		t.Fatal("unprepare of a must stop a's daemon and only it")
	}
	if n := testutil.ToFloat64(d.metrics.MPSDaemons); n != 1 {
		t.Errorf("mps_daemons = %v after unpreparing one, want 1", n)
	}
	mustUnprepare(t, d, a) // idempotent: must not touch b's daemon
	if !e.daemon.IsRunning(string(b.UID)) || e.daemon.Stops[string(a.UID)] != 1 {
		t.Fatal("repeated unprepare stopped a daemon again")
	}
	mustUnprepare(t, d, b)
	if e.daemon.IsRunning(string(b.UID)) || e.daemon.Stops[string(b.UID)] != 1 {
		t.Fatalf("daemon running %v, stopped %d times; want stopped once", e.daemon.IsRunning(string(b.UID)), e.daemon.Stops[string(b.UID)])
	}
}

// Two MPS results of one claim on one GPU share one daemon whose limits
// are their sum.
func TestPrepareMPSLimitsAddUp(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("two", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 2, "1Gi", 10), shareOf("t", 2, "3Gi", 15)})
	mustPrepare(t, d, c)
	id := string(c.UID)
	if got := e.daemon.Shares[id]; e.daemon.Starts[id] != 1 || len(got.GPUs) != 1 || got.GPUs[0].MemoryBytes != 4*gib || got.Cores != 25 {
		t.Fatalf("daemon started %d times with %+v, want once with 4Gi and 25%%", e.daemon.Starts[id], got)
	}
	mustUnprepare(t, d, c)
	if e.daemon.IsRunning(id) || e.daemon.Stops[id] != 1 {
		t.Fatalf("daemon running %v, stopped %d times after unprepare", e.daemon.IsRunning(id), e.daemon.Stops[id])
	}
}

// MPS shares of one claim on two GPUs (HAMi's nvidia.com/gpu: 2 with
// gpumem) get one daemon serving both GPUs, with each GPU's limit at the
// ordinal the container numbers it by, and one set of client settings.
func TestPrepareMPSSharesOnTwoGPUs(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	gpu := func(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }
	// Listed out of order: the daemon and the container number the GPUs
	// in bus order, GPU 1 then GPU 3.
	c := newClaim("pair", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 3, "8000Mi", 30), shareOf("s", 1, "6000Mi", 30)})
	mustPrepare(t, d, c)
	id := string(c.UID)
	want := mps.Share{Claim: c.UID, Cores: 30, GPUs: []mps.Device{
		{GPU: mps.GPU{Index: 1, UUID: gpu(1)}, MemoryBytes: 6000 << 20},
		{GPU: mps.GPU{Index: 3, UUID: gpu(3)}, MemoryBytes: 8000 << 20},
	}}
	if got := e.daemon.Shares[id]; e.daemon.Starts[id] != 1 || !reflect.DeepEqual(got, want) {
		t.Fatalf("daemon started %d times with %+v, want once with %+v", e.daemon.Starts[id], got, want)
	}
	raw, err := os.ReadFile(e.specPath(c.UID))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	edits := spec.Devices[0].ContainerEdits
	pipe := filepath.Join(e.mpsRoot, id, "pipe")
	for _, kv := range []string{
		"NVIDIA_VISIBLE_DEVICES=" + gpu(1) + "," + gpu(3),
		"CUDA_MPS_PIPE_DIRECTORY=" + pipe,
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6000M,1=8000M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
		"GPULINK_SHARE_MEMORY_1=" + fmt.Sprint(int64(8000<<20)),
	} {
		if !slices.Contains(edits.Env, kv) {
			t.Errorf("spec env lacks %s: %v", kv, edits.Env)
		}
	}
	var pipes, shms int
	for _, m := range edits.Mounts {
		switch m.ContainerPath {
		case pipe:
			pipes++
		case "/dev/shm":
			shms++
		}
	}
	if pipes != 1 || shms != 1 {
		t.Errorf("%d pipe and %d shm mounts, want one each: %+v", pipes, shms, edits.Mounts)
	}
	// Two references (one per result), one daemon: the second is no
	// start, and unprepare stops it once.
	mustUnprepare(t, d, c)
	if e.daemon.IsRunning(id) || e.daemon.Stops[id] != 1 {
		t.Fatalf("daemon running %v, stopped %d times after unprepare", e.daemon.IsRunning(id), e.daemon.Stops[id])
	}
}

// A daemon that fails to start for a two-GPU claim leaves nothing behind,
// and a retry starts it once.
func TestPrepareMPSTwoGPUsStartFailureRollsBack(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	e.daemon.StartErr = os.ErrPermission
	c := newClaim("pair", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10), shareOf("s", 2, "1Gi", 10)})
	r := prepare(t, d, c)[c.UID]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "starting MPS control daemon") {
		t.Fatalf("error %v", r.Err)
	}
	if e.specExists(c.UID) || len(readCheckpoint(t, e).Claims) != 0 || len(e.daemon.Running) != 0 {
		t.Error("state left behind after a failed MPS start")
	}
	e.daemon.StartErr = nil
	mustPrepare(t, d, c)
	if id := string(c.UID); e.daemon.Starts[id] != 1 || len(e.daemon.Shares[id].GPUs) != 2 {
		t.Errorf("retry started the daemon %d times with %+v", e.daemon.Starts[id], e.daemon.Shares[id])
	}
}

func TestPrepareSharingStrategies(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	hami := newClaim("hami", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 2, "3Gi", 40)},
		opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("HAMiCore")))
	// Strategy None gives whole GPUs only.
	none := newClaim("none", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)},
		opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, []string{"g"}, sharingConfig("None")))
	mustPrepare(t, d, hami)
	mustPrepare(t, d, none)
	if len(e.daemon.Starts) != 0 {
		t.Errorf("MPS daemons started for non-MPS shares: %v", e.daemon.Starts)
	}
	envOf := func(uid types.UID) string {
		raw, err := os.ReadFile(e.specPath(uid))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	for _, want := range []string{"CUDA_DEVICE_MEMORY_LIMIT_0=3072m", "CUDA_DEVICE_SM_LIMIT_0=40"} {
		if !strings.Contains(envOf(hami.UID), want) {
			t.Errorf("HAMiCore spec lacks %s", want)
		}
	}
	spec := envOf(none.UID)
	if strings.Contains(spec, "GPULINK_SHARE_MEMORY") || strings.Contains(spec, "CUDA_MPS") || strings.Contains(spec, "CUDA_DEVICE_MEMORY_LIMIT") {
		t.Errorf("None spec: %s", spec)
	}
}

func TestPrepareConfigLayering(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	// The class says HAMiCore and 2Gi shares for all requests; the claim,
	// listed first, repeats the strategy and asks for 3Gi shares for
	// request "b" only. Another driver's garbage config is ignored. The
	// shares carry no consumed capacity, so the config's sizes count.
	a, b := shareOf("a", 0, "1Gi", 10), shareOf("b/small", 1, "1Gi", 10)
	a.ConsumedCapacity, b.ConsumedCapacity = nil, nil
	c := newClaim("layers", []resourceapi.DeviceRequestAllocationResult{a, b},
		opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, []string{"b"},
			`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"HAMiCore","defaultMemory":"3Gi"}}`),
		opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil,
			`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"HAMiCore","defaultMemory":"2Gi"}}`),
		opaqueEntry(resourceapi.AllocationConfigSourceClaim, "other.example.com", nil, `{"not": "ours"}`),
	)
	mustPrepare(t, d, c)
	got := readCheckpoint(t, e).Claims[c.UID]
	if s := got.Devices[0].Share; s.Strategy != "HAMiCore" || s.MemoryBytes != 2*gib {
		t.Errorf("request a: share %+v, want HAMiCore and 2Gi from the class", s)
	}
	if s := got.Devices[1].Share; s.Strategy != "HAMiCore" || s.MemoryBytes != 3*gib {
		t.Errorf("request b/small: share %+v, want HAMiCore and 3Gi from the claim", s)
	}
}

func TestPrepareShareDefaultsWithoutConsumedCapacity(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	r := shareOf("s", 0, "1Gi", 1)
	r.ConsumedCapacity = nil
	explicit := `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"defaultMemory":"6Gi"}}`
	c := newClaim("defaults", []resourceapi.DeviceRequestAllocationResult{r},
		opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, explicit))
	mustPrepare(t, d, c)
	share := readCheckpoint(t, e).Claims[c.UID].Devices[0].Share
	// Memory from the config's explicit default, cores from the flag.
	if share.MemoryBytes != 6*gib || share.Cores != 25 {
		t.Errorf("share %+v, want 6Gi from the config and 25 cores from the flag", share)
	}
}

func TestPrepareBadInput(t *testing.T) {
	bad := func(mutate func(*resourceapi.DeviceRequestAllocationResult)) []resourceapi.DeviceRequestAllocationResult {
		r := wholeGPU("gpus", 0)
		mutate(&r)
		return []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 1), r}
	}
	cfg := func(raw string) resourceapi.DeviceAllocationConfiguration {
		return opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, raw)
	}
	for name, tc := range map[string]struct {
		results []resourceapi.DeviceRequestAllocationResult
		configs []resourceapi.DeviceAllocationConfiguration
		want    []string
	}{
		"unknown device": {
			results: bad(func(r *resourceapi.DeviceRequestAllocationResult) { r.Device = "gpu-9" }),
			want:    []string{"status.allocation.devices.results[1].device", `"gpu-9"`, "no GPU with index 9"},
		},
		"malformed device name": {
			results: bad(func(r *resourceapi.DeviceRequestAllocationResult) { r.Device = "nvidia0" }),
			want:    []string{"status.allocation.devices.results[1].device", `"nvidia0"`},
		},
		"other node's pool": {
			results: bad(func(r *resourceapi.DeviceRequestAllocationResult) { r.Pool = "node-b" }),
			want:    []string{"status.allocation.devices.results[1].pool", `"node-b"`},
		},
		"malformed config": {
			results: []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 0)},
			configs: []resourceapi.DeviceAllocationConfiguration{cfg(`{"apiVersion": `)},
			want:    []string{"status.allocation.devices.config[0].opaque.parameters"},
		},
		"unknown config field": {
			results: []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 0)},
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaqueEntry(resourceapi.AllocationConfigSourceClaim, "other.example.com", nil, `{}`),
				cfg(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"stratgy":"MPS"}}`),
			},
			want: []string{"status.allocation.devices.config[1].opaque.parameters", "stratgy"},
		},
		"invalid config value": {
			results: []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 0)},
			configs: []resourceapi.DeviceAllocationConfiguration{cfg(sharingConfig("Magic"))},
			want:    []string{"status.allocation.devices.config[0]", "Magic"},
		},
		"share larger than the GPU": {
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "17Gi", 10)},
			want:    []string{"status.allocation.devices.results[0].consumedCapacity.memory", "17Gi", "larger than GPU 0"},
		},
		"share with 0 cores": {
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 0)},
			want:    []string{"status.allocation.devices.results[0].consumedCapacity.cores", "0"},
		},
		"same GPU whole twice": {
			results: []resourceapi.DeviceRequestAllocationResult{wholeGPU("a", 0), wholeGPU("b", 0)},
			want:    []string{"status.allocation.devices.results[1].device", "whole twice"},
		},
		"share under strategy None": {
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("None"))},
			want:    []string{"status.allocation.devices.results[0]", "sharing.strategy=None", "whole GPUs only"},
		},
		"MPS shares on two GPUs with different cores": {
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10), shareOf("s", 1, "1Gi", 30)},
			want:    []string{"status.allocation.devices.results[1].consumedCapacity.cores", "10%", "30%", "active thread percentage"},
		},
		"MPS and HAMi-core shares of one GPU": {
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10), shareOf("h", 0, "1Gi", 10)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, []string{"h"}, sharingConfig("HAMiCore"))},
			want:    []string{"status.allocation.devices.results[1]", "sharing strategies MPS and HAMiCore"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, loadTopology(t, "pcie-4.txt"))
			d := e.start()
			c := newClaim("bad", tc.results, tc.configs...)
			r := prepare(t, d, c)[c.UID]
			if r.Err == nil {
				t.Fatalf("prepare succeeded with %+v", r.Devices)
			}
			msg := r.Err.Error()
			for _, want := range append([]string{"claim default/bad", string(c.UID)}, tc.want...) {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
			if e.specExists(c.UID) {
				t.Error("CDI spec left behind")
			}
			if n := len(readCheckpoint(t, e).Claims); n != 0 {
				t.Errorf("%d checkpoint entries left behind", n)
			}
			if len(e.daemon.Running) != 0 {
				t.Errorf("MPS daemons left running: %v", e.daemon.Running)
			}
		})
	}
}

func TestPrepareConflicts(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	first := newClaim("first", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0), shareOf("s", 1, "10Gi", 50)},
		opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, []string{"s"}, sharingConfig("HAMiCore")))
	mustPrepare(t, d, first)
	for name, tc := range map[string]struct {
		results []resourceapi.DeviceRequestAllocationResult
		want    string
	}{
		"GPU already whole":  {[]resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)}, "already prepared whole"},
		"GPU already shared": {[]resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 1)}, "share(s) of it are prepared"},
		"memory overcommit":  {[]resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "7Gi", 10)}, "more than the GPU's"},
		// 50 % are prepared; 60 % more would over-commit the SMs.
		"cores overcommit": {[]resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "1Gi", 60)}, "consumedCapacity.cores: shares of \"gpu-1\" would use 110% of the cores"},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClaim("second", tc.results, opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("HAMiCore")))
			r := prepare(t, d, c)[c.UID]
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", r.Err, tc.want)
			}
			if e.specExists(c.UID) {
				t.Error("CDI spec left behind")
			}
		})
	}
	// Admin access may look at a GPU in use.
	admin := wholeGPU("g", 0)
	admin.AdminAccess = new(bool)
	*admin.AdminAccess = true
	mustPrepare(t, d, newClaim("admin", []resourceapi.DeviceRequestAllocationResult{admin}))
}

// A class that opts in to memory over-commit lets its shares of a GPU add
// up past the GPU's memory, up to its percentage, as the controller
// counts them; cores are never over-committed.
func TestPrepareMemoryOvercommitOptIn(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	over := `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"HAMiCore","memoryOvercommitPercent":150}}`
	claim := func(name, mem string, cores int64) *resourceapi.ResourceClaim {
		return newClaim(name, []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, mem, cores)},
			opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, over))
	}
	mustPrepare(t, d, claim("first", "10Gi", 40))
	// 10Gi + 7Gi is more than the GPU's 16Gi but within 150 % of it.
	mustPrepare(t, d, claim("second", "7Gi", 40))
	for name, tc := range map[string]struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		"past the percentage": {claim("third", "8Gi", 10), "more than 150% of the GPU's"},
		"cores":               {claim("fourth", "1Gi", 30), "would use 110% of the cores"},
		// A class without the opt-in never joins an over-committed GPU.
		"no opt-in": {newClaim("fifth", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "1Gi", 10)},
			opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("HAMiCore"))), "more than the GPU's"},
	} {
		r := prepare(t, d, tc.c)[tc.c.UID]
		if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, r.Err, tc.want)
		}
	}
}

func TestPrepareBatchIsolatesBadClaims(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	good := newClaim("good", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)})
	badClaim := newClaim("bad", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 7)})
	res := prepare(t, d, good, badClaim)
	if res[good.UID].Err != nil || res[badClaim.UID].Err == nil {
		t.Fatalf("results %+v", res)
	}
	if !e.specExists(good.UID) || e.specExists(badClaim.UID) {
		t.Errorf("spec of good %v, of bad %v", e.specExists(good.UID), e.specExists(badClaim.UID))
	}
}

// A claim listed twice in one call (a pod naming it twice) is prepared
// once: one MPS reference, so its unprepare stops the daemon.
func TestPrepareClaimListedTwice(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))

	d := e.start()
	c := newClaim("mps", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	res, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{c, c})
	if err != nil || len(res) != 1 || res[c.UID].Err != nil || len(res[c.UID].Devices) != 1 {
		t.Fatalf("PrepareResourceClaims = %+v, %v", res, err)
	}
	if got := e.daemon.Starts[string(c.UID)]; got != 1 {
		t.Errorf("MPS daemon started %d times, want 1", got)
	}
	mustUnprepare(t, d, c)
	if e.daemon.IsRunning(string(c.UID)) {
		t.Error("MPS daemon still running after its only claim was unprepared")
	}
}

func TestPrepareMPSStartFailureRollsBack(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	e.daemon.StartErr = os.ErrPermission
	c := newClaim("mps", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	r := prepare(t, d, c)[c.UID]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "starting MPS control daemon") {
		t.Fatalf("error %v", r.Err)
	}
	if e.specExists(c.UID) || len(readCheckpoint(t, e).Claims) != 0 {
		t.Error("state left behind after a failed MPS start")
	}
	e.daemon.StartErr = nil
	mustPrepare(t, d, c)
}

func TestRestartRecovery(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()

	kept := newClaim("kept", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	kept2 := newClaim("kept2", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	whole := newClaim("whole", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 2)})
	mustPrepare(t, d, kept)
	mustPrepare(t, d, kept2)
	devs := mustPrepare(t, d, whole)

	// A stray spec (its claim's unprepare happened while the files were
	// out of sync) and a half-prepared claim from an interrupted call.
	stray := types.UID("0b7d5c0e-0000-4000-8000-000000000001")
	if err := os.WriteFile(e.specPath(stray), []byte(`{"cdiVersion":"0.3.0","kind":"gpu.gpulink.dev/claim","devices":[{"name":"x","containerEdits":{"env":["A=B"]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	half := newClaim("half", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)})
	cp := readCheckpoint(t, e)
	cp.Claims[half.UID] = &PreparedClaim{UID: half.UID, Namespace: "default", Name: "half", State: PrepareStarted,
		CDIDeviceID: CDIDeviceID(half.UID), Devices: []PreparedDevice{{Request: "g", Pool: testNode, Device: "gpu-3", Index: 3, Minor: 3}}}
	if err := NewCheckpointStore(e.pluginDir).Store(cp); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.specPath(half.UID), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Removing a prepared claim's spec by hand: recovery rewrites it.
	if err := os.Remove(e.specPath(whole.UID)); err != nil {
		t.Fatal(err)
	}

	// Restart: a new Driver on the same directories, new MPS manager,
	// daemons still running.
	d2 := e.start()
	if e.specExists(stray) || e.specExists(half.UID) {
		t.Error("stray or half-prepared specs survived the restart")
	}
	if !e.specExists(whole.UID) || !e.specExists(kept.UID) {
		t.Error("spec of a prepared claim missing after restart")
	}
	if _, ok := readCheckpoint(t, e).Claims[half.UID]; ok {
		t.Error("half-prepared claim still in the checkpoint")
	}
	// Served from the checkpoint.
	again := mustPrepare(t, d2, whole)
	if len(again) != 1 || again[0].CDIDeviceIDs[0] != devs[0].CDIDeviceIDs[0] {
		t.Errorf("after restart %+v, want %+v", again, devs)
	}
	// MPS references were rebuilt: each claim holds its own daemon.
	mustUnprepare(t, d2, kept)
	if !e.daemon.IsRunning(string(kept2.UID)) {
		t.Fatal("kept2's daemon stopped by another claim's unprepare")
	}
	mustUnprepare(t, d2, kept2)
	if e.daemon.IsRunning(string(kept.UID)) || e.daemon.IsRunning(string(kept2.UID)) {
		t.Fatal("daemon still running after its last claim")
	}
	// GPU 3 is free again.
	mustPrepare(t, d2, half)
}

// A crash after apply started the MPS daemon but before PrepareCompleted
// was recorded leaves the claim in PrepareStarted without MPSRef; the
// rollback at restart must still stop the daemon it started.
func TestRestartRollsBackInterruptedMPSStart(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))

	d := e.start()
	c := newClaim("mps", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	mustPrepare(t, d, c)
	if !e.daemon.IsRunning(string(c.UID)) {
		t.Fatal("MPS daemon not started")
	}
	cp := readCheckpoint(t, e)
	pc := cp.Claims[c.UID]
	pc.State = PrepareStarted
	pc.Devices[0].Share.MPSRef = false
	if err := NewCheckpointStore(e.pluginDir).Store(cp); err != nil {
		t.Fatal(err)
	}

	d2 := e.start()
	if e.daemon.IsRunning(string(c.UID)) {
		t.Error("MPS daemon of the rolled-back claim still running")
	}
	if e.specExists(c.UID) || len(readCheckpoint(t, e).Claims) != 0 {
		t.Error("state of the rolled-back claim left behind")
	}
	mustPrepare(t, d2, c)
	mustUnprepare(t, d2, c)
	if e.daemon.IsRunning(string(c.UID)) {
		t.Error("MPS daemon still running after its last claim")
	}
}

func TestRestartAfterReboot(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("c", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	mustPrepare(t, d, c)
	starts := e.daemon.Starts[string(c.UID)]
	e.bootID = "boot-2"
	e.start()
	cp := readCheckpoint(t, e)
	if len(cp.Claims) != 0 || cp.BootID != "boot-2" {
		t.Errorf("checkpoint after reboot: %d claims, boot ID %s", len(cp.Claims), cp.BootID)
	}
	if e.specExists(c.UID) {
		t.Error("spec of a claim from the previous boot survived")
	}
	if got := e.daemon.Starts[string(c.UID)]; got != starts {
		t.Errorf("daemon restarted for a claim of the previous boot")
	}
}

func TestRestartWithCorruptCheckpoint(t *testing.T) {
	for name, corrupt := range map[string]func(t *testing.T, path string){
		"bad JSON": func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(`{"checksum":`), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"checksum mismatch": func(t *testing.T, path string) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var f checkpointFile
			if err := json.Unmarshal(raw, &f); err != nil {
				t.Fatal(err)
			}
			f.Data = json.RawMessage(strings.Replace(string(f.Data), `"gpu-0"`, `"gpu-1"`, 1))
			raw, _ = json.Marshal(f)
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, loadTopology(t, "pcie-4.txt"))
			d := e.start()
			c := newClaim("c", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)})
			mustPrepare(t, d, c)
			path := NewCheckpointStore(e.pluginDir).Path()
			corrupt(t, path)

			d2 := e.start()
			if got := testutil.ToFloat64(d2.metrics.CheckpointCorruptions); got != 1 {
				t.Errorf("corruption counter %v, want 1", got)
			}
			if _, err := os.Stat(path + ".corrupt"); err != nil {
				t.Errorf("corrupt checkpoint not moved aside: %v", err)
			}
			if e.specExists(c.UID) {
				t.Error("CDI spec of a claim the plugin no longer knows survived")
			}
			if n := len(readCheckpoint(t, e).Claims); n != 0 {
				t.Errorf("%d claims in the fresh checkpoint", n)
			}
			// The kubelet prepares the claim again.
			mustPrepare(t, d2, c)
		})
	}
}

func TestPrepareCheckpointWriteFailure(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	path := NewCheckpointStore(e.pluginDir).Path()
	// A non-empty directory in the checkpoint's place makes the rename fail
	// (root ignores permission bits, so those cannot be used).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(path+"/blocker", 0o755); err != nil {
		t.Fatal(err)
	}
	c := newClaim("c", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	r := prepare(t, d, c)[c.UID]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "recording PrepareStarted") || !strings.Contains(r.Err.Error(), "claim default/c") {
		t.Fatalf("error %v", r.Err)
	}
	if e.specExists(c.UID) || len(e.daemon.Running) != 0 {
		t.Error("side effects despite the failed checkpoint write")
	}
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	mustPrepare(t, d, c)
	if readCheckpoint(t, e).Claims[c.UID] == nil {
		t.Error("claim not checkpointed after recovery of the file system")
	}
}

// The plugin enforces the same rule as the controller, for claims any
// allocator (kube-scheduler included) wrote: a claim's config may not pick
// another sharing strategy than its class's or raise maxSharesPerGPU.
func TestPrepareRefusesClaimConfigBeyondTheClass(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	classMPS := opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, []string{"s"},
		`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","maxSharesPerGPU":8}}`)
	for name, tc := range map[string]struct {
		claim string
		want  []string
	}{
		"strategy":  {sharingConfig("HAMiCore"), []string{"sharing.strategy", "HAMiCore", "MPS"}},
		"no limits": {sharingConfig("None"), []string{"sharing.strategy", "None", "MPS"}},
		"more shares": {`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"maxSharesPerGPU":9}}`,
			[]string{"sharing.maxSharesPerGPU", "9", "8"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClaim("greedy", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "1Gi", 10)},
				classMPS, opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, tc.claim))
			r := prepare(t, d, c)[c.UID]
			if r.Err == nil {
				t.Fatal("prepared a claim whose config overrides its class's sharing settings")
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Err.Error(), w) {
					t.Errorf("error %q does not mention %q", r.Err, w)
				}
			}
			if e.specExists(c.UID) || len(e.daemon.Starts) != 0 {
				t.Error("CDI spec or MPS daemon left behind")
			}
		})
	}
	// Narrowing is fine: the class's strategy again, fewer shares.
	ok := newClaim("modest", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "1Gi", 10)}, classMPS,
		opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil,
			`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","maxSharesPerGPU":2}}`))
	mustPrepare(t, d, ok)
}

// A daemon that survives a plugin restart but cannot be adopted (it does
// not answer) is kept for the claim's running containers and stopped by
// the claim's unprepare, not leaked.
func TestRestartKeptMPSDaemonStoppedAtUnprepare(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("mps", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	mustPrepare(t, d, c)
	e.daemon.StartErr = fmt.Errorf("did not answer (%w)", mps.ErrDaemonKept)
	d2 := e.start()
	e.daemon.StartErr = nil
	if !e.daemon.IsRunning(string(c.UID)) {
		t.Fatal("kept daemon stopped at restart")
	}
	mustUnprepare(t, d2, c)
	if e.daemon.IsRunning(string(c.UID)) || e.daemon.Stops[string(c.UID)] != 1 {
		t.Errorf("kept daemon running %v, stopped %d times after unprepare; want stopped once", e.daemon.IsRunning(string(c.UID)), e.daemon.Stops[string(c.UID)])
	}
}

// A claim prepared by a version without per-GPU CDI devices: its
// checkpoint entry has no device IDs and its spec only the claim device.
// The kubelet may still start containers with the IDs it got then, so the
// claim keeps that layout: it is answered with the old IDs, its spec is
// not rewritten (and restored as it was when missing), and it unprepares
// cleanly. Only a new prepare gets per-GPU devices.
func TestPrepareClaimOfOldVersion(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	c := newClaim("old", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 3), wholeGPU("gpus", 0)})
	uid := string(c.UID)
	claimID := CDIDeviceID(c.UID)
	data := `{"version":"gpulink.kubeletplugin/v1","bootID":"boot-1","claims":{"` + uid + `":{"uid":"` + uid + `","namespace":"default","name":"old","state":"PrepareCompleted","cdiDeviceID":"` + claimID + `",` +
		`"devices":[{"request":"gpus","pool":"node-a","device":"gpu-3","index":3,"minor":3,"uuid":"GPU-00000003-0000-0000-0000-000000000000","pciBusID":"0000:1A:00.0"},` +
		`{"request":"gpus","pool":"node-a","device":"gpu-0","index":0,"minor":0,"uuid":"GPU-00000000-0000-0000-0000-000000000000","pciBusID":"0000:17:00.0"}]}}}`
	raw := `{"checksum":"` + checksum([]byte(data)) + `","data":` + data + `}`
	node := func(path string) string {
		return `{"path":"` + path + `","hostPath":"` + filepath.Join(e.driverRoot, path) + `","type":"c","major":1,"minor":3}`
	}
	oldSpec := `{"cdiVersion":"0.6.0","kind":"gpu.gpulink.dev/claim","annotations":{"gpu.gpulink.dev/claim":"default/old"},"devices":[{"name":"` + uid + `","containerEdits":{` +
		`"env":["NVIDIA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000,GPU-00000003-0000-0000-0000-000000000000","CUDA_DEVICE_ORDER=PCI_BUS_ID"],` +
		`"deviceNodes":[` + strings.Join([]string{node("/dev/nvidia0"), node("/dev/nvidia3"), node("/dev/nvidiactl"), node("/dev/nvidia-uvm"), node("/dev/nvidia-uvm-tools")}, ",") + `]}}]}`
	for path, content := range map[string]string{filepath.Join(e.pluginDir, CheckpointFile): raw, e.specPath(c.UID): oldSpec} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantNodes := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl"}
	checkOld := func(d *Driver) {
		t.Helper()
		devs := mustPrepare(t, d, c)
		if len(devs) != 2 {
			t.Fatalf("devices %+v", devs)
		}
		for _, dev := range devs {
			if !slices.Equal(dev.CDIDeviceIDs, []string{claimID}) {
				t.Errorf("device %s: CDI IDs %v, want the old %v", dev.DeviceName, dev.CDIDeviceIDs, []string{claimID})
			}
		}
		spec := injectDevices(t, e, devs)
		if got := deviceNodes(spec); !slices.Equal(got, wantNodes) {
			t.Errorf("device nodes %v, want %v", got, wantNodes)
		}
		if got := envMap(spec)["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-00000000-0000-0000-0000-000000000000,GPU-00000003-0000-0000-0000-000000000000" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%s", got)
		}
	}

	d := e.start()
	checkOld(d)
	if got, err := os.ReadFile(e.specPath(c.UID)); err != nil || string(got) != oldSpec {
		t.Errorf("the old spec was rewritten (%v):\n%s", err, got)
	}

	// Its spec lost: a restart restores it in the old layout, the GPUs'
	// nodes in the claim device.
	if err := os.Remove(e.specPath(c.UID)); err != nil {
		t.Fatal(err)
	}
	d = e.start()
	restored, err := cdiapi.ReadSpec(e.specPath(c.UID), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(restored.Devices) != 1 || restored.Devices[0].Name != uid {
		t.Errorf("restored spec devices %+v, want the claim device only", restored.Devices)
	}
	checkOld(d)

	mustUnprepare(t, d, c)
	if e.specExists(c.UID) || len(readCheckpoint(t, e).Claims) != 0 {
		t.Error("state of the old claim left after unprepare")
	}
	// Prepared anew: per-GPU devices.
	for _, dev := range mustPrepare(t, d, c) {
		if want := []string{CDIDeviceIDForDevice(c.UID, dev.DeviceName), claimID}; !slices.Equal(dev.CDIDeviceIDs, want) {
			t.Errorf("device %s prepared anew: CDI IDs %v, want %v", dev.DeviceName, dev.CDIDeviceIDs, want)
		}
	}
}
