package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
)

// faultyMIG injects failures and crashes into MIG on demand's seam.
type faultyMIG struct {
	MIGInstanceManager
	// createErr fails the n-th Create (1-based; 0: none).
	createErr   error
	failCreateN int
	creates     int
	// crashAfterCreate panics after a successful Create, as a plugin
	// killed between creating the instance and recording it would stop.
	crashAfterCreate bool
	// crashBeforeCreate panics instead of creating.
	crashBeforeCreate bool
	// destroyErr fails every Destroy while set.
	destroyErr error
}

func (f *faultyMIG) Create(ctx context.Context, parentUUID string, p mig.Partition) (mig.Instance, error) {
	f.creates++
	if f.crashBeforeCreate {
		panic("crash before create")
	}
	if f.failCreateN == f.creates {
		return mig.Instance{}, f.createErr
	}
	in, err := f.MIGInstanceManager.Create(ctx, parentUUID, p)
	if err == nil && f.crashAfterCreate {
		panic("crash after create")
	}
	return in, err
}

func (f *faultyMIG) Destroy(ctx context.Context, parentUUID string, giProfileID int, pl mig.Placement) error {
	if f.destroyErr != nil {
		return f.destroyErr
	}
	return f.MIGInstanceManager.Destroy(ctx, parentUUID, giProfileID, pl)
}

// onDemandEnv is an env on a simulated DGX (server) whose GPUs 0 and 1
// are in MIG mode (GPU 1 with a static 7g instance on an A100), GPU 0
// partitioned on demand, with the capability nodes in the driver root.
type onDemandEnv struct {
	*env
	lib   nvml.Interface
	fault *faultyMIG
	uuid  string
	// md is the simulated node: discovering it lists the instances that
	// exist now (env.live).
	md discovery.Discoverer
}

func newOnDemandEnv(t *testing.T, server string, gpu1 []string) *onDemandEnv {
	t.Helper()
	md, err := discovery.NewMockWith(server, discovery.MockOptions{MIG: map[int][]string{0: nil, 1: gpu1}})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := md.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, topo)
	e.opts.MIGOnDemand = "0"
	lib, _ := discovery.MockLibrary(md)
	f := &faultyMIG{MIGInstanceManager: MIGInstancesFor(md)}
	e.mig = f
	caps := filepath.Join(e.driverRoot, "dev", "nvidia-caps")
	if err := os.MkdirAll(caps, 0o755); err != nil {
		t.Fatal(err)
	}
	for m := range 300 {
		if err := os.Symlink("/dev/null", filepath.Join(caps, fmt.Sprintf("nvidia-cap%d", m))); err != nil {
			t.Fatal(err)
		}
	}
	return &onDemandEnv{env: e, lib: lib, fault: f, uuid: topo.GPUs[0].UUID, md: md}
}

// instances lists GPU 0's GPU instances.
func (e *onDemandEnv) instances(t *testing.T) []discovery.GPUInstance {
	t.Helper()
	gis, err := e.fault.GPUInstances(context.Background(), e.uuid)
	if err != nil {
		t.Fatal(err)
	}
	return gis
}

// createGIOnly makes a GPU instance without a compute instance on GPU 0,
// as a plugin killed between the two calls leaves it.
func (e *onDemandEnv) createGIOnly(t *testing.T, profileID int, pl mig.Placement) {
	t.Helper()
	h, ret := e.lib.DeviceGetHandleByUUID(e.uuid)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := h.GetGpuInstanceProfileInfo(profileID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := h.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}

// crash runs fn, which must panic, as a plugin killed mid-call.
func crash(t *testing.T, fn func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatal("the call did not crash")
		}
	}()
	fn()
}

func partResult(request, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver.Name, Pool: testNode, Device: device}
}

func TestPrepareOnDemand(t *testing.T) {
	for _, c := range []struct {
		server, device string
		placement      mig.Placement
	}{
		{"dgxa100", "gpu-0-part-3g-20gb-at-4", mig.Placement{Start: 4, Size: 4}},
		{"dgxh100", "gpu-0-part-1g-10gb-with-me-at-2", mig.Placement{Start: 2, Size: 1}},
	} {
		t.Run(c.server, func(t *testing.T) {
			e := newOnDemandEnv(t, c.server, nil)
			d := e.start()
			// The slices carry GPU 0's partitions and counter set.
			res := d.Resources()
			var names []string
			sets := 0
			for _, s := range res.Pools[testNode].Slices {
				for _, dev := range s.Devices {
					names = append(names, dev.Name)
				}
				sets += len(s.SharedCounters)
			}
			joined := strings.Join(names, " ")
			if sets != 1 || !strings.Contains(joined, c.device) || strings.Contains(joined, "gpu-0 ") {
				t.Fatalf("published %d counter sets and devices %s; want gpu-0-mig and %s", sets, joined, c.device)
			}
			claim := newClaim("part", []resourceapi.DeviceRequestAllocationResult{partResult("mig", c.device)})
			devs := mustPrepare(t, d, claim)
			gis := e.instances(t)
			if len(gis) != 1 || gis[0].Placement != c.placement || gis[0].ComputeInstances != 1 {
				t.Fatalf("instances after prepare %+v, want one at %v with a compute instance", gis, c.placement)
			}
			pc := d.cp.Claims[claim.UID]
			dev := pc.Devices[0]
			if !strings.HasPrefix(dev.UUID, "MIG-") || dev.MIG.GI != gis[0].ID || dev.MIG.CI < 0 || dev.MIG.GICapMinor < 0 || dev.MIG.OnDemand == nil {
				t.Errorf("prepared device %+v (MIG %+v)", dev, dev.MIG)
			}
			// The CDI spec is a static MIG device's: parent node, caps,
			// NVIDIA_VISIBLE_DEVICES=MIG-<uuid>.
			spec := readSpec(t, e.env, claim.UID)
			var env, nodes []string
			env = append(env, spec.ContainerEdits.Env...)
			for _, sd := range spec.Devices {
				env = append(env, sd.ContainerEdits.Env...)
				for _, n := range sd.ContainerEdits.DeviceNodes {
					nodes = append(nodes, n.Path)
				}
			}
			for _, n := range []string{"/dev/nvidia0", fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", dev.MIG.GICapMinor), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", dev.MIG.CICapMinor)} {
				if !slices.Contains(nodes, n) {
					t.Errorf("CDI device nodes %v lack %s", nodes, n)
				}
			}
			if !slices.Contains(env, "NVIDIA_VISIBLE_DEVICES="+dev.UUID) {
				t.Errorf("CDI env %v lacks NVIDIA_VISIBLE_DEVICES=%s", env, dev.UUID)
			}
			if len(devs) != 1 || devs[0].DeviceName != c.device {
				t.Errorf("kubelet devices %+v, want %s", devs, c.device)
			}
			// Preparing again answers from the checkpoint.
			if again := mustPrepare(t, d, claim); len(again) != 1 || len(e.instances(t)) != 1 {
				t.Errorf("second prepare: %+v, %d instances", again, len(e.instances(t)))
			}
			mustUnprepare(t, d, claim)
			if gis := e.instances(t); len(gis) != 0 || e.specExists(claim.UID) {
				t.Errorf("after unprepare: instances %+v, spec exists %v; want none", gis, e.specExists(claim.UID))
			}
			mustUnprepare(t, d, claim)
		})
	}
}

func TestPrepareOnDemandBadInput(t *testing.T) {
	e := newOnDemandEnv(t, "dgxa100", []string{"7g.40gb"})
	d := e.start()
	held := newClaim("held", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-3g-20gb-at-4")})
	mustPrepare(t, d, held)
	shared := partResult("mig", "gpu-0-part-1g-5gb-at-0")
	shared.ShareID = ptr.To(types.UID("0b5c6b0e-8f0a-4f7e-9a55-0c6f3c7d2d11"))
	admin := partResult("mig", "gpu-0-part-1g-5gb-at-0")
	admin.AdminAccess = ptr.To(true)
	for _, c := range []struct {
		name   string
		result resourceapi.DeviceRequestAllocationResult
		want   string
	}{
		{"GPU not in MIG mode", partResult("mig", "gpu-2-part-1g-5gb-at-0"), `status.allocation.devices.results[0].device: "gpu-2-part-1g-5gb-at-0": GPU 2 is not in MIG mode`},
		{"GPU in MIG mode, not on demand", partResult("mig", "gpu-1-part-1g-5gb-at-0"), `"gpu-1-part-1g-5gb-at-0": GPU 1 on node node-a is not partitioned on demand (--mig-on-demand)`},
		{"unknown profile", partResult("mig", "gpu-0-part-9g-99gb-at-0"), `status.allocation.devices.results[0].device: "gpu-0-part-9g-99gb-at-0": GPU 0 (Mock NVIDIA A100-SXM4-40GB) has no MIG profile "9g-99gb"; its model has 1g.5gb, 2g.10gb`},
		{"profile of another model", partResult("mig", "gpu-0-part-2g-20gb-at-0"), `has no MIG profile "2g-20gb"; its model has`},
		{"placement the profile lacks", partResult("mig", "gpu-0-part-3g-20gb-at-2"), `MIG profile 3g.20gb of GPU 0 (Mock NVIDIA A100-SXM4-40GB) has no placement starting at memory slice "2" (its placements start at 0, 4)`},
		{"no such GPU", partResult("mig", "gpu-9-part-1g-5gb-at-0"), `no GPU with index 9`},
		{"share", shared, `status.allocation.devices.results[0].shareID: 0b5c6b0e-8f0a-4f7e-9a55-0c6f3c7d2d11: partition "gpu-0-part-1g-5gb-at-0" is given out whole`},
		{"admin access", admin, `status.allocation.devices.results[0].adminAccess: partition "gpu-0-part-1g-5gb-at-0" exists only while a claim holds it`},
		{"overlaps a prepared partition", partResult("mig", "gpu-0-part-1g-5gb-at-5"), `partition "gpu-0-part-1g-5gb-at-5" cannot exist beside the partitions already prepared on GPU 0 (gpu-0-part-3g-20gb-at-4 of another claim): 3g.20gb at 4+4 overlaps 1g.5gb at 5+1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			claim := newClaim("bad", []resourceapi.DeviceRequestAllocationResult{c.result})
			res := prepare(t, d, claim)[claim.UID]
			if res.Err == nil || !strings.Contains(res.Err.Error(), c.want) {
				t.Fatalf("prepare: %v, want an error containing %q", res.Err, c.want)
			}
			if _, ok := d.cp.Claims[claim.UID]; ok || e.specExists(claim.UID) {
				t.Error("a refused claim left a checkpoint entry or a CDI spec")
			}
			if gis := e.instances(t); len(gis) != 1 {
				t.Errorf("instances %+v, want only the held claim's", gis)
			}
		})
	}
	// Two partitions of one claim that overlap each other.
	claim := newClaim("self", []resourceapi.DeviceRequestAllocationResult{partResult("a", "gpu-0-part-2g-10gb-at-0"), partResult("b", "gpu-0-part-1g-5gb-at-1")})
	if res := prepare(t, d, claim)[claim.UID]; res.Err == nil || !strings.Contains(res.Err.Error(), "status.allocation.devices.results[1].device: partition \"gpu-0-part-1g-5gb-at-1\" cannot exist beside") {
		t.Errorf("prepare of two overlapping partitions: %v", res.Err)
	}
	// A GPU named by --mig-on-demand that is not in MIG mode stops the
	// plugin at start: gpulink never enables MIG mode.
	e.opts.MIGOnDemand = "0,2"
	if _, err := e.newDriver(); err == nil || !strings.Contains(err.Error(), "GPU 2") || !strings.Contains(err.Error(), "is not in MIG mode; gpulink never changes a GPU's MIG mode") {
		t.Errorf("New with a GPU not in MIG mode: %v", err)
	}
	for _, bad := range []string{"x", "0,-1", "GPU"} {
		e.opts.MIGOnDemand = bad
		if _, err := e.newDriver(); err == nil || !strings.Contains(err.Error(), "--mig-on-demand") {
			t.Errorf("New with --mig-on-demand=%q: %v", bad, err)
		}
	}
}

// TestPrepareOnDemandFailuresLeaveNothing: a failed create, of the first
// or the second partition of a claim, leaves no instance, no CDI spec and
// no checkpoint entry; a failed destroy keeps the claim for the kubelet's
// retry.
func TestPrepareOnDemandFailuresLeaveNothing(t *testing.T) {
	e := newOnDemandEnv(t, "dgxa100", nil)
	d := e.start()
	two := []resourceapi.DeviceRequestAllocationResult{partResult("a", "gpu-0-part-2g-10gb-at-0"), partResult("b", "gpu-0-part-3g-20gb-at-4")}
	for n := 1; n <= 2; n++ {
		e.fault.creates, e.fault.failCreateN, e.fault.createErr = 0, n, errors.New("injected create failure")
		claim := newClaim(fmt.Sprintf("fail-%d", n), two)
		res := prepare(t, d, claim)[claim.UID]
		if res.Err == nil || !strings.Contains(res.Err.Error(), "injected create failure") {
			t.Errorf("create %d failing: prepare %v", n, res.Err)
		}
		if gis := e.instances(t); len(gis) != 0 || e.specExists(claim.UID) || d.cp.Claims[claim.UID] != nil {
			t.Errorf("create %d failing left instances %+v, spec %v, entry %v", n, gis, e.specExists(claim.UID), d.cp.Claims[claim.UID] != nil)
		}
	}
	e.fault.failCreateN = 0
	claim := newClaim("ok", two)
	mustPrepare(t, d, claim)
	e.fault.destroyErr = errors.New("injected destroy failure")
	if err := unprepare(t, d, claim)[claim.UID]; err == nil || !strings.Contains(err.Error(), "injected destroy failure") {
		t.Errorf("unprepare with a failing destroy: %v", err)
	}
	if d.cp.Claims[claim.UID] == nil {
		t.Fatal("a failed unprepare dropped the claim; the kubelet's retry could not finish it")
	}
	e.fault.destroyErr = nil
	mustUnprepare(t, d, claim)
	if gis := e.instances(t); len(gis) != 0 {
		t.Errorf("instances after the retried unprepare: %+v", gis)
	}
}

// TestOnDemandCrashRecovery: a plugin killed at each point of a prepare
// leaves, after its restart, no instance, CDI spec or checkpoint entry of
// the interrupted claim, while a completed claim keeps its instance.
func TestOnDemandCrashRecovery(t *testing.T) {
	pl := mig.Placement{Start: 4, Size: 4}
	for _, c := range []struct {
		name  string
		crash func(e *onDemandEnv, d *Driver, claim *resourceapi.ResourceClaim)
	}{
		{"before create", func(e *onDemandEnv, d *Driver, claim *resourceapi.ResourceClaim) {
			e.fault.crashBeforeCreate = true
			crash(e.t.(*testing.T), func() { prepare(e.t.(*testing.T), d, claim) })
			e.fault.crashBeforeCreate = false
		}},
		{"after the GPU instance, before the compute instance", func(e *onDemandEnv, d *Driver, claim *resourceapi.ResourceClaim) {
			e.fault.crashBeforeCreate = true
			crash(e.t.(*testing.T), func() { prepare(e.t.(*testing.T), d, claim) })
			e.fault.crashBeforeCreate = false
			e.createGIOnly(e.t.(*testing.T), nvml.GPU_INSTANCE_PROFILE_3_SLICE, pl)
		}},
		{"after create, before PrepareCompleted", func(e *onDemandEnv, d *Driver, claim *resourceapi.ResourceClaim) {
			e.fault.crashAfterCreate = true
			crash(e.t.(*testing.T), func() { prepare(e.t.(*testing.T), d, claim) })
			e.fault.crashAfterCreate = false
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newOnDemandEnv(t, "dgxa100", nil)
			e.t = t
			d := e.start()
			kept := newClaim("kept", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-1g-5gb-at-0")})
			mustPrepare(t, d, kept)
			claim := newClaim("crashed", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-3g-20gb-at-4")})
			c.crash(e, d, claim)
			d.rolling.lock.Close()
			restarted := e.start()
			if restarted.cp.Claims[claim.UID] != nil || e.specExists(claim.UID) {
				t.Errorf("after restart: entry %v, spec %v; want neither", restarted.cp.Claims[claim.UID] != nil, e.specExists(claim.UID))
			}
			gis := e.instances(t)
			if len(gis) != 1 || gis[0].Placement != (mig.Placement{Start: 0, Size: 1}) || restarted.cp.Claims[kept.UID] == nil {
				t.Errorf("after restart: instances %+v, kept claim %v; want only the kept claim's 1g.5gb at 0", gis, restarted.cp.Claims[kept.UID] != nil)
			}
			// The placement is usable again.
			mustPrepare(t, restarted, claim)
			mustUnprepare(t, restarted, claim)
			mustUnprepare(t, restarted, kept)
			if gis := e.instances(t); len(gis) != 0 {
				t.Errorf("instances left: %+v", gis)
			}
		})
	}
}

// TestOnDemandAdoption: a GPU with instances gpulink did not create is not
// partitioned on demand (and its instances survive); an adopted GPU's
// instances that no prepared claim holds are destroyed at start.
func TestOnDemandAdoption(t *testing.T) {
	t.Run("foreign instances", func(t *testing.T) {
		e := newOnDemandEnv(t, "dgxa100", nil)
		e.createGIOnly(t, nvml.GPU_INSTANCE_PROFILE_2_SLICE, mig.Placement{Start: 0, Size: 2})
		d := e.start()
		if d.topo.GPUs[0].MIG.OnDemand || len(d.cp.OnDemandGPUs) != 0 {
			t.Errorf("GPU 0 with a foreign instance: OnDemand %v, adopted %v; want neither", d.topo.GPUs[0].MIG.OnDemand, d.cp.OnDemandGPUs)
		}
		for _, s := range d.Resources().Pools[testNode].Slices {
			if len(s.SharedCounters) > 0 {
				t.Errorf("counter sets published for a refused GPU: %v", s.SharedCounters)
			}
		}
		if gis := e.instances(t); len(gis) != 1 {
			t.Errorf("the foreign instance was touched: %+v", gis)
		}
	})
	t.Run("orphans on an adopted GPU", func(t *testing.T) {
		e := newOnDemandEnv(t, "dgxa100", nil)
		d := e.start()
		if len(d.cp.OnDemandGPUs) != 1 || d.cp.OnDemandGPUs[0] != e.uuid {
			t.Fatalf("adopted %v, want GPU 0", d.cp.OnDemandGPUs)
		}
		claim := newClaim("lost", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-4g-20gb-at-0")})
		mustPrepare(t, d, claim)
		// The claim's entry is lost (as by hand), its instance stays.
		delete(d.cp.Claims, claim.UID)
		if err := d.store(); err != nil {
			t.Fatal(err)
		}
		d.rolling.lock.Close()
		restarted := e.start()
		if gis := e.instances(t); len(gis) != 0 || !restarted.topo.GPUs[0].MIG.OnDemand {
			t.Errorf("after restart: instances %+v, on demand %v; want the orphan destroyed and GPU 0 on demand", gis, restarted.topo.GPUs[0].MIG.OnDemand)
		}
	})
}
