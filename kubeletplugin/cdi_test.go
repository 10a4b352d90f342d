package kubeletplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// injected prepares a claim, loads the spec directory with the CDI
// library as a container runtime would, and injects the CDI devices of all
// the claim's devices into an empty OCI spec (injectDevices). Each
// device's first ID must be its own GPU's device.
func injected(t *testing.T, e *env, d *Driver, c *resourceapi.ResourceClaim) *oci.Spec {
	t.Helper()
	devs := mustPrepare(t, d, c)
	for _, dev := range devs {
		if want := CDIDeviceIDForDevice(c.UID, dev.DeviceName); len(dev.CDIDeviceIDs) == 0 || dev.CDIDeviceIDs[0] != want {
			t.Errorf("device %s: CDI IDs %v, want %s first", dev.DeviceName, dev.CDIDeviceIDs, want)
		}
	}
	return injectDevices(t, e, devs)
}

// injectDevices loads the spec directory with the CDI library and injects
// the CDI devices of devs into an empty OCI spec, in the order and with
// the repetitions the kubelet passes them on to the runtime (it
// concatenates the IDs of a claim's devices).
func injectDevices(t *testing.T, e *env, devs []draplugin.Device) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatalf("CDI library rejects the spec directory: %v", err)
	}
	var ids []string
	for _, dev := range devs {
		for _, id := range dev.CDIDeviceIDs {
			if cache.GetDevice(id) == nil {
				t.Fatalf("CDI device %s not found; have %v", id, cache.ListDevices())
			}
		}
		ids = append(ids, dev.CDIDeviceIDs...)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("injecting %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return spec
}

func envMap(spec *oci.Spec) map[string]string {
	m := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func deviceNodes(spec *oci.Spec) []string {
	var out []string
	for _, d := range spec.Linux.Devices {
		out = append(out, d.Path)
	}
	slices.Sort(out)
	return out
}

func TestCDISpecWholeGPUs(t *testing.T) {
	e := newEnv(t, loadTopology(t, "v100-sxm2-8-aliyun-sccgn6.txt"))
	d := e.start()
	c := newClaim("train", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 6), wholeGPU("gpus", 2)})
	spec := injected(t, e, d, c)

	want := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia2", "/dev/nvidia6", "/dev/nvidiactl"}
	if got := deviceNodes(spec); !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v (only the claim's GPUs)", got, want)
	}
	env := envMap(spec)
	// PCI bus order: GPU2 (0000:12) before GPU6 (0000:16).
	if got, want := env["NVIDIA_VISIBLE_DEVICES"], "GPU-00000002-0000-0000-0000-000000000000,GPU-00000006-0000-0000-0000-000000000000"; got != want {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%s, want %s", got, want)
	}
	if env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" {
		t.Errorf("CUDA_DEVICE_ORDER=%s", env["CUDA_DEVICE_ORDER"])
	}
	for k := range env {
		if strings.HasPrefix(k, "CUDA_MPS") || strings.HasPrefix(k, "GPULINK_SHARE") {
			t.Errorf("whole GPUs got share variable %s", k)
		}
	}
	// Each GPU's own CDI device names it at its CUDA ordinal.
	if env["GPULINK_DEVICE_0"] != "gpu-2" || env["GPULINK_DEVICE_1"] != "gpu-6" {
		t.Errorf("GPULINK_DEVICE_0=%s GPULINK_DEVICE_1=%s, want gpu-2 and gpu-6", env["GPULINK_DEVICE_0"], env["GPULINK_DEVICE_1"])
	}
	raw, err := cdiapi.ReadSpec(e.specPath(c.UID), 0)
	if err != nil {
		t.Fatal(err)
	}
	if raw.GetClass() != "claim" || raw.GetVendor() != driver.Name {
		t.Errorf("spec kind %s", raw.Kind)
	}
	// The claim device with the shared edits, then one device per GPU
	// with only that GPU's node and variable.
	type layout struct {
		name  string
		nodes []string
		env   []string
	}
	var got []layout
	for _, dev := range raw.Devices {
		l := layout{name: dev.Name, env: dev.ContainerEdits.Env}
		for _, n := range dev.ContainerEdits.DeviceNodes {
			l.nodes = append(l.nodes, n.Path)
			// Host paths live under the driver root.
			if n.HostPath != filepath.Join(e.driverRoot, n.Path) {
				t.Errorf("device node %s has host path %s, want it under %s", n.Path, n.HostPath, e.driverRoot)
			}
		}
		got = append(got, l)
	}
	uid := string(c.UID)
	wantDevs := []layout{
		{name: uid, nodes: driver.ControlDeviceNodes(), env: []string{
			"NVIDIA_VISIBLE_DEVICES=GPU-00000002-0000-0000-0000-000000000000,GPU-00000006-0000-0000-0000-000000000000",
			"CUDA_DEVICE_ORDER=PCI_BUS_ID",
		}},
		{name: uid + "-gpu-2", nodes: []string{"/dev/nvidia2"}, env: []string{"GPULINK_DEVICE_0=gpu-2"}},
		{name: uid + "-gpu-6", nodes: []string{"/dev/nvidia6"}, env: []string{"GPULINK_DEVICE_1=gpu-6"}},
	}
	if !reflect.DeepEqual(got, wantDevs) {
		t.Errorf("spec devices\n got %+v\nwant %+v", got, wantDevs)
	}
}

// Several results sharing one GPU in one claim name the same per-GPU CDI
// device: one GPU, one entry in the pod's allocatedResourcesStatus.
func TestCDISharesOfOneGPUOneDevice(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("two", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 2, "1Gi", 10), shareOf("t", 2, "3Gi", 15), shareOf("u", 0, "1Gi", 25)})
	spec := injected(t, e, d, c)
	devs := mustPrepare(t, d, c)
	if len(devs) != 3 || !slices.Equal(devs[0].CDIDeviceIDs, devs[1].CDIDeviceIDs) || slices.Equal(devs[0].CDIDeviceIDs, devs[2].CDIDeviceIDs) {
		t.Errorf("devices %+v: the two shares of gpu-2 must name the same CDI devices, gpu-0 its own", devs)
	}
	raw, err := cdiapi.ReadSpec(e.specPath(c.UID), 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, dev := range raw.Devices {
		names = append(names, dev.Name)
	}
	uid := string(c.UID)
	if want := []string{uid, uid + "-gpu-0", uid + "-gpu-2"}; !slices.Equal(names, want) {
		t.Errorf("spec devices %v, want %v", names, want)
	}
	if got, want := deviceNodes(spec), []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v", got, want)
	}
	env := envMap(spec)
	if env["GPULINK_SHARE_MEMORY_1"] != "4294967296" || env["GPULINK_DEVICE_0"] != "gpu-0" || env["GPULINK_DEVICE_1"] != "gpu-2" {
		t.Errorf("env %v", env)
	}
}

func TestCDISpecMPSShare(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("infer", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "5Gi", 30)})
	spec := injected(t, e, d, c)
	env := envMap(spec)
	pipe := filepath.Join(e.mpsRoot, string(c.UID), "pipe")
	shm := filepath.Join(e.mpsRoot, string(c.UID), "shm")
	for k, want := range map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY":           pipe,
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=5120M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
		"GPULINK_SHARE_MEMORY_0":            "5368709120",
		"GPULINK_SHARE_CORES_0":             "30",
		"NVIDIA_VISIBLE_DEVICES":            "GPU-00000001-0000-0000-0000-000000000000",
	} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	var foundPipe, foundShm bool
	for _, m := range spec.Mounts {
		if m.Destination == pipe && m.Source == pipe {
			foundPipe = true
		}
		if m.Destination == "/dev/shm" && m.Source == shm {
			foundShm = true
		}
	}
	if !foundPipe || !foundShm {
		t.Errorf("pipe directory %s (%v) or shm directory %s as /dev/shm (%v) not mounted: %+v", pipe, foundPipe, shm, foundShm, spec.Mounts)
	}
	if got, want := deviceNodes(spec), []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v", got, want)
	}
}

func TestCDIMissingDeviceNodes(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	e.opts.DriverRoot = filepath.Join(e.dir, "no-driver")
	d := e.start()
	// Nodes without GPUs: device nodes are left out, the spec stays valid.
	c := newClaim("sim", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)})
	spec := injected(t, e, d, c)
	if spec.Linux != nil && len(spec.Linux.Devices) != 0 {
		t.Errorf("device nodes %v although none exist", deviceNodes(spec))
	}
	if envMap(spec)["NVIDIA_VISIBLE_DEVICES"] == "" {
		t.Error("NVIDIA_VISIBLE_DEVICES missing")
	}
	// The GPU's own CDI device is there without its node.
	if got := envMap(spec)["GPULINK_DEVICE_0"]; got != "gpu-0" {
		t.Errorf("GPULINK_DEVICE_0=%q, want gpu-0", got)
	}

	// Real GPUs: a missing device node fails the claim and leaves nothing.
	e.opts.RequireDeviceNodes = true
	d = e.start()
	c2 := newClaim("real", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 1)})
	r := prepare(t, d, c2)[c2.UID]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "device node") || !strings.Contains(r.Err.Error(), "claim default/real") {
		t.Fatalf("error %v", r.Err)
	}
	if e.specExists(c2.UID) {
		t.Error("spec written for a failed claim")
	}
}

func TestCDIListAndRemove(t *testing.T) {
	dir := t.TempDir()
	c, err := NewCDIDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pc := &PreparedClaim{UID: "1f0e4a2c-1111-4222-8333-444455556666", Namespace: "ns", Name: "n",
		Devices: []PreparedDevice{{Index: 0, Minor: 0}}}
	spec, err := buildClaimSpec(testLogger(t), pc, cdiOptions{Stat: os.Stat, Root: DriverRoot{Host: "/"}, RequireDeviceNodes: false, MPSDirs: func(mps.Share) mps.Dirs { return mps.Dirs{} }})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteClaimSpec(pc.UID, spec); err != nil {
		t.Fatal(err)
	}
	uids, err := c.ListClaimSpecs()
	if err != nil || len(uids) != 1 || uids[0] != pc.UID {
		t.Fatalf("ListClaimSpecs = %v, %v", uids, err)
	}
	if err := c.RemoveClaimSpec(pc.UID); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveClaimSpec(pc.UID); err != nil {
		t.Fatalf("removing a missing spec: %v", err)
	}
	if uids, _ := c.ListClaimSpecs(); len(uids) != 0 {
		t.Errorf("specs left: %v", uids)
	}
}

// devicesOfRequest is what the kubelet passes on for a container that
// names one request of the claim.
func devicesOfRequest(devs []draplugin.Device, request string) []draplugin.Device {
	var out []draplugin.Device
	for _, d := range devs {
		if slices.Contains(d.Requests, request) {
			out = append(out, d)
		}
	}
	return out
}

// A whole GPU beside an MPS share in one claim (NVIDIA's quickstart
// gpu-test5): the containers of each request see their own GPU, and only
// the MPS request's containers talk to the claim's daemon, numbering its
// GPU as the daemon does.
func TestCDIRequestViews(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("mixed", []resourceapi.DeviceRequestAllocationResult{
		wholeGPU("ts-gpu", 2),
		shareOf("mps-gpu", 1, "10Gi", 50),
		shareOf("hami-gpu", 3, "2Gi", 20),
	}, opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, []string{"hami-gpu"}, sharingConfig("HAMiCore")))
	devs := mustPrepare(t, d, c)
	uuid := func(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }
	pipe := filepath.Join(e.mpsRoot, string(c.UID), "pipe")
	for _, tc := range []struct {
		request string
		nodes   []string
		env     map[string]string
		absent  []string
	}{
		{"ts-gpu", []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia2", "/dev/nvidiactl"},
			map[string]string{"NVIDIA_VISIBLE_DEVICES": uuid(2), "GPULINK_DEVICE_0": "gpu-2"},
			[]string{"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "GPULINK_SHARE_CORES_0", "GPULINK_DEVICE_1", "CUDA_DEVICE_SM_LIMIT_0"}},
		{"mps-gpu", []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidiactl"},
			map[string]string{"NVIDIA_VISIBLE_DEVICES": uuid(1), "GPULINK_DEVICE_0": "gpu-1", "CUDA_MPS_PIPE_DIRECTORY": pipe,
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "GPULINK_SHARE_CORES_0": "50"},
			[]string{"GPULINK_DEVICE_1", "CUDA_DEVICE_SM_LIMIT_0"}},
		{"hami-gpu", []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia3", "/dev/nvidiactl"},
			map[string]string{"NVIDIA_VISIBLE_DEVICES": uuid(3), "GPULINK_DEVICE_0": "gpu-3", "CUDA_DEVICE_MEMORY_LIMIT_0": "2048m", "CUDA_DEVICE_SM_LIMIT_0": "20"},
			[]string{"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}},
	} {
		spec := injectDevices(t, e, devicesOfRequest(devs, tc.request))
		if got := deviceNodes(spec); !slices.Equal(got, tc.nodes) {
			t.Errorf("request %s: device nodes %v, want %v", tc.request, got, tc.nodes)
		}
		env := envMap(spec)
		for k, want := range tc.env {
			if env[k] != want {
				t.Errorf("request %s: %s=%q, want %q", tc.request, k, env[k], want)
			}
		}
		for _, k := range tc.absent {
			if v, ok := env[k]; ok {
				t.Errorf("request %s: %s=%q set, want it absent", tc.request, k, v)
			}
		}
	}
	// The claim's daemon serves its MPS GPU only.
	share := e.daemon.Shares[string(c.UID)]
	if len(share.GPUs) != 1 || share.GPUs[0].Index != 1 || share.Cores != 50 {
		t.Errorf("MPS daemon share %+v, want GPU 1 only at 50%%", share)
	}
	// A restarted plugin answers with the same CDI IDs from its checkpoint.
	again := mustPrepare(t, e.start(), c)
	for i := range devs {
		if !slices.Equal(devs[i].CDIDeviceIDs, again[i].CDIDeviceIDs) {
			t.Errorf("device %d: CDI IDs %v after a restart, %v before", i, again[i].CDIDeviceIDs, devs[i].CDIDeviceIDs)
		}
	}
	mustUnprepare(t, e.start(), c)
	if e.specExists(c.UID) {
		t.Error("CDI spec left behind after unprepare")
	}
}
