package kubeletplugin

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// concurrentClass is the configuration of a DeviceClass of Concurrent MPS
// shares, as the allocator copies it into the claim (FromClass).
func concurrentClass(extra string) resourceapi.DeviceAllocationConfiguration {
	return opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil,
		`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsMode":"Concurrent"`+extra+`}}`)
}

// concurrentClaim is a claim of namespace ns with Concurrent MPS results.
func concurrentClaim(name, ns string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := newClaim(name, results, concurrentClass(""))
	c.Namespace = ns
	return c
}

// gpuUUID is GPU i's UUID in loadTopology.
func gpuUUID(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }

// groupID is the ID of namespace ns's daemon on GPU i of the test topology.
func groupID(ns string, i int) string {
	return mps.GroupID(ns, mps.GPU{Index: i, UUID: gpuUUID(i)})
}

// Two claims of one namespace on one GPU in Concurrent mode share one
// daemon, the namespace's on that GPU; each claim's containers get their
// own limits and priority in their environment (the daemon has none of its
// own) and the group's pipe and shm. The daemon stops with the last claim.
func TestPrepareConcurrentMPSOneDaemonPerGroup(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	a := concurrentClaim("a", "team-a", shareOf("s", 1, "4Gi", 30))
	b := newClaim("b", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "2Gi", 20)}, concurrentClass(`,"priority":1`))
	b.Namespace = "team-a"
	devsA := mustPrepare(t, d, a)
	devsB := mustPrepare(t, d, b)
	id := groupID("team-a", 1)
	if len(e.daemon.Starts) != 1 || e.daemon.Starts[id] != 1 || !e.daemon.IsRunning(id) {
		t.Fatalf("daemon starts %v, want one: %s", e.daemon.Starts, id)
	}
	if got := e.daemon.Shares[id]; got.Group != "team-a" || len(got.GPUs) != 1 || got.GPUs[0].UUID != gpuUUID(1) {
		t.Errorf("the group's daemon started with %+v", got)
	}
	if n := d.mps.(interface{ Refs(string) int }).Refs(id); n != 2 {
		t.Errorf("group daemon references %d, want 2", n)
	}
	pipe := filepath.Join(e.mpsRoot, id, "pipe")
	shm := filepath.Join(e.mpsRoot, id, "shm")
	for _, tc := range []struct {
		name string
		devs []draplugin.Device
		want map[string]string
		none []string
	}{
		{"a", devsA, map[string]string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}, []string{envMPSClientPriority}},
		{"b", devsB, map[string]string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20", envMPSClientPriority: "1"}, nil},
	} {
		spec := injectDevices(t, e, tc.devs)
		env := envMap(spec)
		tc.want["CUDA_MPS_PIPE_DIRECTORY"] = pipe
		tc.want["NVIDIA_VISIBLE_DEVICES"] = gpuUUID(1)
		for k, want := range tc.want {
			if env[k] != want {
				t.Errorf("claim %s: %s=%q, want %q", tc.name, k, env[k], want)
			}
		}
		for _, k := range tc.none {
			if v, ok := env[k]; ok {
				t.Errorf("claim %s: %s=%q set", tc.name, k, v)
			}
		}
		var mounted []string
		for _, m := range spec.Mounts {
			if (m.Source == pipe && m.Destination == pipe) || (m.Source == shm && m.Destination == "/dev/shm") {
				mounted = append(mounted, m.Destination)
			}
		}
		if len(mounted) != 2 {
			t.Errorf("claim %s: the group's pipe and shm mounted at %v, want both: %+v", tc.name, mounted, spec.Mounts)
		}
	}
	share := readCheckpoint(t, e).Claims[b.UID].Devices[0].Share
	if share == nil || share.MPSMode != apiv1alpha1.MPSConcurrent || !share.MPSRef {
		t.Errorf("checkpointed share %+v", share)
	}
	mustUnprepare(t, d, a)
	if !e.daemon.IsRunning(id) || e.daemon.Stops[id] != 0 {
		t.Fatal("the group's daemon stopped while claim b still uses it")
	}
	mustUnprepare(t, d, a) // idempotent
	mustUnprepare(t, d, b)
	if e.daemon.IsRunning(id) || e.daemon.Stops[id] != 1 {
		t.Fatalf("daemon running %v, stopped %d times after the group's last claim", e.daemon.IsRunning(id), e.daemon.Stops[id])
	}
}

// Claims of two namespaces get a daemon each, on GPUs of their own; an
// Isolated claim keeps its own daemon beside them.
func TestPrepareConcurrentMPSTwoNamespaces(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	a := concurrentClaim("a", "team-a", shareOf("s", 1, "4Gi", 30))
	b := concurrentClaim("b", "team-b", shareOf("s", 2, "4Gi", 30))
	iso := newClaim("iso", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 3, "4Gi", 30)})
	for _, c := range []*resourceapi.ResourceClaim{a, b, iso} {
		mustPrepare(t, d, c)
	}
	for _, id := range []string{groupID("team-a", 1), groupID("team-b", 2), string(iso.UID)} {
		if e.daemon.Starts[id] != 1 || !e.daemon.IsRunning(id) {
			t.Errorf("daemon %s: started %d times, running %v", id, e.daemon.Starts[id], e.daemon.IsRunning(id))
		}
	}
	if len(e.daemon.Starts) != 3 {
		t.Errorf("starts %v, want three daemons", e.daemon.Starts)
	}
	mustUnprepare(t, d, a)
	if e.daemon.IsRunning(groupID("team-a", 1)) || !e.daemon.IsRunning(groupID("team-b", 2)) {
		t.Error("unpreparing team-a's claim must stop team-a's daemon and only it")
	}
}

// A GPU with Concurrent shares carries only Concurrent shares of their
// namespace: the kubelet plugin refuses the rest by name, whoever
// allocated them, and leaves nothing behind.
func TestPrepareConcurrentMPSPlacementConflicts(t *testing.T) {
	concurrentOn := func(name, ns string, gpu int) *resourceapi.ResourceClaim {
		return concurrentClaim(name, ns, shareOf("s", gpu, "2Gi", 20))
	}
	isolatedOn := func(name, ns string, gpu int) *resourceapi.ResourceClaim {
		c := newClaim(name, []resourceapi.DeviceRequestAllocationResult{shareOf("s", gpu, "2Gi", 20)})
		c.Namespace = ns
		return c
	}
	hamiOn := func(name, ns string, gpu int) *resourceapi.ResourceClaim {
		c := newClaim(name, []resourceapi.DeviceRequestAllocationResult{shareOf("s", gpu, "2Gi", 20)},
			opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("HAMiCore")))
		c.Namespace = ns
		return c
	}
	for _, tc := range []struct {
		name        string
		first, then *resourceapi.ResourceClaim
		want        []string
	}{
		{"another namespace's Concurrent share", concurrentOn("a", "team-a", 0), concurrentOn("b", "team-b", 0),
			[]string{"results[0].device", `"gpu-0" carries Concurrent MPS shares of another namespace`, "of namespace team-b cannot join it"}},
		{"Concurrent beside Isolated", isolatedOn("a", "team-a", 0), concurrentOn("b", "team-a", 0),
			[]string{`"gpu-0" carries a share that is not a Concurrent MPS share (Isolated MPS`, "set by its own clients"}},
		{"Isolated beside Concurrent", concurrentOn("a", "team-a", 0), isolatedOn("b", "team-a", 0),
			[]string{`"gpu-0" carries Concurrent MPS shares of this claim's namespace team-a`, "this share (Isolated MPS) would not be protected"}},
		{"HAMi-core beside Concurrent", concurrentOn("a", "team-a", 0), hamiOn("b", "team-b", 0),
			[]string{"Concurrent MPS shares of another namespace", "this share (HAMiCore)"}},
		{"Concurrent beside HAMi-core", hamiOn("a", "team-b", 0), concurrentOn("b", "team-a", 0),
			[]string{"not a Concurrent MPS share (HAMiCore, of another claim)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, loadTopology(t, "pcie-4.txt"))
			d := e.start()
			mustPrepare(t, d, tc.first)
			starts := len(e.daemon.Starts)
			r := prepare(t, d, tc.then)[tc.then.UID]
			if r.Err == nil {
				t.Fatal("prepared")
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Err.Error(), w) {
					t.Errorf("error %q does not mention %q", r.Err, w)
				}
			}
			if e.specExists(tc.then.UID) || readCheckpoint(t, e).Claims[tc.then.UID] != nil || len(e.daemon.Starts) != starts {
				t.Error("the refused claim left state behind")
			}
			// Once the first claim is gone, the GPU takes the other.
			mustUnprepare(t, d, tc.first)
			mustPrepare(t, d, tc.then)
		})
	}
	// Same namespace, same GPU, Concurrent: fine (the first test), and
	// so is a whole GPU next to it.
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	mustPrepare(t, d, concurrentOn("a", "team-a", 0))
	mustPrepare(t, d, newClaim("whole", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 1)}))
}

// A claim's containers reach one MPS daemon: its Concurrent shares must be
// on one GPU, and its MPS shares must not mix the modes.
func TestPrepareConcurrentMPSClaimShape(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	twoGPUs := concurrentClaim("two", "team-a", shareOf("s", 0, "2Gi", 20), shareOf("s", 1, "2Gi", 20))
	mixed := newClaim("mixed", []resourceapi.DeviceRequestAllocationResult{shareOf("c", 0, "2Gi", 20), shareOf("i", 1, "2Gi", 20)},
		opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, []string{"c"}, `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"mpsMode":"Concurrent"}}`))
	mixed.Namespace = "team-a"
	claimMode := concurrentClaim("claim-mode", "team-a", shareOf("s", 2, "2Gi", 20))
	claimMode.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil,
		`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"mpsMode":"Concurrent"}}`)}
	for _, tc := range []struct {
		c    *resourceapi.ResourceClaim
		want []string
	}{
		{twoGPUs, []string{"results[1].device", "results[0] is on GPU 0", "must all be on one GPU", "mpsMode Concurrent"}},
		{mixed, []string{"results[1]: sharing.mpsMode Isolated, but status.allocation.devices.results[0] has Concurrent", "one MPS mode"}},
		{claimMode, []string{"sharing.mpsMode", "claim sets Concurrent", "only the DeviceClass chooses it"}},
	} {
		r := prepare(t, d, tc.c)[tc.c.UID]
		if r.Err == nil {
			t.Errorf("claim %s prepared", tc.c.Name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.Err.Error(), w) {
				t.Errorf("claim %s: error %q does not mention %q", tc.c.Name, r.Err, w)
			}
		}
	}
	if len(e.daemon.Starts) != 0 || len(readCheckpoint(t, e).Claims) != 0 {
		t.Errorf("refused claims left state: starts %v", e.daemon.Starts)
	}
	// Two Concurrent results of one claim on one GPU add up, one daemon.
	one := concurrentClaim("one", "team-a", shareOf("s", 3, "1Gi", 10), shareOf("t", 3, "3Gi", 15))
	spec := injectDevices(t, e, mustPrepare(t, d, one))
	if env := envMap(spec); env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" {
		t.Errorf("limits of two results: %v", env)
	}
	if n := d.mps.(interface{ Refs(string) int }).Refs(groupID("team-a", 3)); n != 2 || e.daemon.Starts[groupID("team-a", 3)] != 1 {
		t.Errorf("references %d, starts %v", n, e.daemon.Starts)
	}
}

// A restart rebuilds the group daemon's references from the checkpoint:
// one per MPS result of every claim of the group on the GPU.
func TestRestartRebuildsConcurrentMPSRefs(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	a := concurrentClaim("a", "team-a", shareOf("s", 1, "1Gi", 10), shareOf("t", 1, "1Gi", 10))
	b := concurrentClaim("b", "team-a", shareOf("s", 1, "1Gi", 10))
	mustPrepare(t, d, a)
	mustPrepare(t, d, b)
	id := groupID("team-a", 1)

	d2 := e.start()
	if n := d2.mps.(interface{ Refs(string) int }).Refs(id); n != 3 {
		t.Fatalf("references after the restart %d, want 3 (two of a, one of b)", n)
	}
	// The fake daemon was "started" again on adoption; what matters is
	// that it keeps running until the group's last claim goes.
	mustUnprepare(t, d2, b)
	if !e.daemon.IsRunning(id) {
		t.Fatal("the group's daemon stopped while claim a still uses it")
	}
	mustUnprepare(t, d2, a)
	if e.daemon.IsRunning(id) {
		t.Fatal("the group's daemon still runs after its last claim")
	}
}

// A crash between taking the group daemon's reference and recording
// PrepareCompleted leaves nothing behind: the restart rolls the claim back,
// releasing its reference, so the daemon stops with the group's last
// prepared claim, or at once when the interrupted claim was the only one.
func TestRestartRollsBackInterruptedConcurrentMPS(t *testing.T) {
	interrupt := func(t *testing.T, e *env, c *resourceapi.ResourceClaim) {
		t.Helper()
		cp := readCheckpoint(t, e)
		pc := cp.Claims[c.UID]
		pc.State = PrepareStarted
		for i := range pc.Devices {
			pc.Devices[i].Share.MPSRef = false // written only with PrepareCompleted
		}
		if err := NewCheckpointStore(e.pluginDir).Store(cp); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("beside a prepared claim of the group", func(t *testing.T) {
		e := newEnv(t, loadTopology(t, "pcie-4.txt"))
		d := e.start()
		a := concurrentClaim("a", "team-a", shareOf("s", 1, "1Gi", 10))
		b := concurrentClaim("b", "team-a", shareOf("s", 1, "1Gi", 10))
		mustPrepare(t, d, a)
		mustPrepare(t, d, b)
		interrupt(t, e, b)
		id := groupID("team-a", 1)

		d2 := e.start()
		if e.specExists(b.UID) || readCheckpoint(t, e).Claims[b.UID] != nil {
			t.Error("the interrupted claim's state survived the restart")
		}
		if n := d2.mps.(interface{ Refs(string) int }).Refs(id); n != 1 || !e.daemon.IsRunning(id) {
			t.Fatalf("after the rollback: %d references, running %v; want a's one, running", n, e.daemon.IsRunning(id))
		}
		mustUnprepare(t, d2, a)
		if e.daemon.IsRunning(id) {
			t.Error("the group's daemon still runs after its last prepared claim: the rolled-back claim's reference leaked")
		}
	})
	t.Run("the group's only claim", func(t *testing.T) {
		e := newEnv(t, loadTopology(t, "pcie-4.txt"))
		d := e.start()
		c := concurrentClaim("c", "team-a", shareOf("s", 1, "1Gi", 10))
		mustPrepare(t, d, c)
		interrupt(t, e, c)
		id := groupID("team-a", 1)

		d2 := e.start()
		if e.daemon.IsRunning(id) || e.specExists(c.UID) || len(readCheckpoint(t, e).Claims) != 0 {
			t.Errorf("left behind: daemon running %v, spec %v, checkpoint %v", e.daemon.IsRunning(id), e.specExists(c.UID), readCheckpoint(t, e).Claims)
		}
		mustPrepare(t, d2, c)
		if !e.daemon.IsRunning(id) {
			t.Error("preparing the claim again did not start the group's daemon")
		}
	})
}
