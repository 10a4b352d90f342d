package kubeletplugin

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
)

// publishedDevices lists the devices of the node's slices.
func publishedDevices(d *Driver) []string {
	var out []string
	for _, s := range d.Resources().Pools[testNode].Slices {
		for _, dev := range s.Devices {
			out = append(out, dev.Name)
		}
	}
	return out
}

// An instance created for a claim's partition belongs to that claim: no
// other claim gets it by naming it as a static MIG device
// (gpu-N-mig-<GI>-<CI>), after a rediscovery (which lists the instance),
// or after a restart with the GPU no longer partitioned on demand, and it
// is not published as a static MIG device either. Otherwise two tenants
// would share one MIG instance, and the first one's unprepare would
// destroy it under the second.
func TestOnDemandInstanceIsNeverAStaticDevice(t *testing.T) {
	e := newOnDemandEnv(t, "dgxa100", nil)
	e.live = e.md
	d := e.start()
	held := newClaim("held", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-3g-20gb-at-4")})
	held.Namespace = "victim-ns"
	mustPrepare(t, d, held)
	in := d.cp.Claims[held.UID].Devices[0].MIG
	static := driver.MIGDeviceName(0, in.GI, in.CI)

	// The rediscovery lists the new instance.
	if _, err := d.Rediscover(e.ctx); err != nil {
		t.Fatal(err)
	}
	if devs := publishedDevices(d); slices.Contains(devs, static) {
		t.Errorf("after a rediscovery the partition's instance is published as %s", static)
	}
	thief := newClaim("thief", []resourceapi.DeviceRequestAllocationResult{migResult("g", static)})
	if err := prepare(t, d, thief)[thief.UID].Err; err == nil || !strings.Contains(err.Error(), "is partitioned on demand") {
		t.Errorf("a claim naming the partition's instance %s after a rediscovery: %v, want a refusal", static, err)
	}

	// Restarted with the GPU left out of --mig-on-demand: the claim is
	// still prepared and keeps its instance, which is neither published
	// nor given to another claim.
	e.opts.MIGOnDemand = ""
	d = e.start()
	if devs := publishedDevices(d); slices.Contains(devs, static) {
		t.Errorf("after a restart the partition's instance is published as static device %s: %v", static, devs)
	}
	res := prepare(t, d, thief)[thief.UID]
	if res.Err == nil {
		t.Fatalf("a second claim got the partition's instance %s after a restart", static)
	}
	if strings.Contains(res.Err.Error(), "victim-ns") || strings.Contains(res.Err.Error(), string(held.UID)) {
		t.Errorf("refusal %q names the other tenant", res.Err)
	}
	// The conflict check alone refuses it too (the instance listed as a
	// static device, as a discovery without the filter would).
	d.mu.Lock()
	for i := range d.topo.GPUs {
		if g := &d.topo.GPUs[i]; g.Index == 0 && len(g.MIG.Instances) == 0 {
			topo, err := e.md.Discover(e.ctx)
			if err != nil {
				d.mu.Unlock()
				t.Fatal(err)
			}
			g.MIG = topo.GPUs[0].MIG
		}
	}
	d.mu.Unlock()
	if err := prepare(t, d, thief)[thief.UID].Err; err == nil || !strings.Contains(err.Error(), fmt.Sprintf("MIG device %q is already prepared for another claim", static)) {
		t.Errorf("conflict check on the partition's instance named as %s: %v", static, err)
	}
	mustUnprepare(t, d, held)
	if gis := e.instances(t); len(gis) != 0 {
		t.Errorf("instances after the holder's unprepare: %+v", gis)
	}
}

// A corrupt checkpoint loses whose a GPU's MIG instances are. Those on a
// GPU named by --mig-on-demand may be running pods' partitions: they are
// neither destroyed nor published as static MIG devices (a second tenant
// would get them) until they are gone, across restarts.
func TestOnDemandInstancesWithheldAfterCorruptCheckpoint(t *testing.T) {
	e := newOnDemandEnv(t, "dgxa100", nil)
	e.live = e.md
	d := e.start()
	held := newClaim("held", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-3g-20gb-at-4")})
	mustPrepare(t, d, held)
	in := d.cp.Claims[held.UID].Devices[0].MIG
	static := driver.MIGDeviceName(0, in.GI, in.CI)
	gpu0 := func(devs []string) []string {
		var out []string
		for _, n := range devs {
			if strings.HasPrefix(n, "gpu-0-") {
				out = append(out, n)
			}
		}
		return out
	}
	if err := os.WriteFile(NewCheckpointStore(e.pluginDir).Path(), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, when := range []string{"after the corrupt checkpoint", "after one more restart"} {
		d = e.start()
		if devs := gpu0(publishedDevices(d)); len(devs) != 0 {
			t.Errorf("%s: GPU 0 publishes %v, want nothing while instances of unknown owners exist", when, devs)
		}
		if gis := e.instances(t); len(gis) != 1 {
			t.Fatalf("%s: instances %+v, want the running pod's kept", when, gis)
		}
		thief := newClaim("thief", []resourceapi.DeviceRequestAllocationResult{migResult("g", static)})
		if err := prepare(t, d, thief)[thief.UID].Err; err == nil {
			t.Errorf("%s: a claim got %s, an instance of unknown owner", when, static)
		}
	}
	// Its pod ended; the administrator destroys the instance, as the log
	// says, and restarts the plugin: the GPU is partitioned on demand again.
	gi := e.instances(t)[0]
	if err := e.fault.Destroy(e.ctx, e.uuid, gi.ProfileID, gi.Placement); err != nil {
		t.Fatal(err)
	}
	d = e.start()
	if devs := gpu0(publishedDevices(d)); !slices.Contains(devs, "gpu-0-part-3g-20gb-at-4") {
		t.Errorf("GPU 0 publishes %v after its instances are gone, want its partitions", devs)
	}
	if len(d.cp.WithheldGPUs) != 0 || !slices.Contains(d.cp.OnDemandGPUs, e.uuid) {
		t.Errorf("withheld %v, on demand %v; want GPU 0 adopted again", d.cp.WithheldGPUs, d.cp.OnDemandGPUs)
	}
}
