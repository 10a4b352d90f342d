package planner

import (
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
)

func nic(name, root string) controllertest.NIC { return controllertest.NIC{Name: name, PCIeRoot: root} }

// Other drivers' slices: the newest complete generation of a node-local
// pool counts; incomplete pools and slices for no node do not; deleting a
// slice forgets its devices.
func TestForeignInventory(t *testing.T) {
	inv := NewInventory()
	names := func() []string {
		var out []string
		f := inv.Foreign("n0")
		if f == nil {
			return nil
		}
		for _, d := range f.Devices {
			out = append(out, d.Name)
		}
		return out
	}
	s1 := controllertest.NICSlice("n0", []controllertest.NIC{nic("nic-1", "r"), nic("nic-0", "r")})
	if err := inv.Upsert(s1); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"nic-0", "nic-1"}) {
		t.Fatalf("devices %v, want nic-0, nic-1", got)
	}
	// Generation 2 announced in two slices, one here: not used yet.
	s2 := controllertest.NICSlice("n0", []controllertest.NIC{nic("nic-2", "r")})
	s2.Name, s2.Spec.Pool.Generation, s2.Spec.Pool.ResourceSliceCount = "second", 2, 2
	if err := inv.Upsert(s2); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 0 {
		t.Fatalf("devices %v while generation 2 is incomplete, want none", got)
	}
	if p := inv.ForeignProblems()[controllertest.NICDriver+"/n0"]; !strings.Contains(p, "generation 2 has 1 of its 2 slices") {
		t.Fatalf("problem %q", p)
	}
	inv.Remove(s2)
	if got := names(); !slices.Equal(got, []string{"nic-0", "nic-1"}) {
		t.Fatalf("devices %v after the incomplete generation went, want nic-0, nic-1", got)
	}
	all := controllertest.NICSlice("n0", []controllertest.NIC{nic("net", "r")})
	all.Name, all.Spec.Pool.Name, all.Spec.NodeName, all.Spec.AllNodes = "network", "net", nil, ptr.To(true)
	if err := inv.Upsert(all); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"nic-0", "nic-1"}) {
		t.Fatalf("devices %v with a network-attached slice, want nic-0, nic-1", got)
	}
	inv.Remove(s1)
	if got := names(); len(got) != 0 {
		t.Fatalf("devices %v after the slice went, want none", got)
	}
	if len(inv.All()) != 0 {
		t.Fatalf("other drivers' slices made gpulink nodes")
	}
}

// TestUpsertForeignSameVersionKeepsNode: as for gpulink's slices
// (TestUpsertSameVersionKeepsNode), the informer's resync of another
// driver's slice at the version stored keeps the node's ForeignNode (its
// selector memo, the slot counts kept for it); a taint a DeviceTaintRule
// puts on the same version, or a new version, replaces it.
func TestUpsertForeignSameVersionKeepsNode(t *testing.T) {
	inv := NewInventory()
	s := controllertest.NICSlice("n0", []controllertest.NIC{nic("nic-0", "r"), nic("nic-1", "r")})
	s.UID, s.ResourceVersion = apitypes.UID("nics-n0"), "5"
	if err := inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	first := inv.Foreign("n0")
	if first == nil {
		t.Fatal("node n0 has no other drivers' devices")
	}
	if err := inv.Upsert(s.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if inv.Foreign("n0") != first {
		t.Fatal("the same slice version replaced the node's devices")
	}
	tainted := s.DeepCopy()
	tainted.Spec.Devices[1].Taints = []resourceapi.DeviceTaint{{Key: "example.com/broken", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if err := inv.Upsert(tainted); err != nil {
		t.Fatal(err)
	}
	now := inv.Foreign("n0")
	if now == first || len(now.Devices) != 2 || len(now.Devices[1].Taints) != 1 {
		t.Fatalf("a DeviceTaintRule's taint on the same slice version not seen: %+v", now)
	}
	next := tainted.DeepCopy()
	next.ResourceVersion = "6"
	next.Spec.Devices = next.Spec.Devices[:1]
	if err := inv.Upsert(next); err != nil {
		t.Fatal(err)
	}
	if got := inv.Foreign("n0"); got == now || len(got.Devices) != 1 {
		t.Fatalf("a new slice version kept the node's old devices: %+v", got)
	}
}

// Every claim's results of other drivers hold their devices, whoever
// allocated them; admin access holds nothing; a deleted claim of other
// drivers' devices alone is not kept for its pods.
func TestLedgerCountsOtherDrivers(t *testing.T) {
	l := NewLedger()
	key := DeviceKey{Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-0"}
	r := resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-0"}
	admin := r
	admin.Device, admin.AdminAccess = "nic-1", ptr.To(true)
	c := controllertest.ClaimWith("c", "1", r, admin)
	l.Observe(c)
	if !l.ForeignHeld(key) {
		t.Fatal("nic-0 not held")
	}
	if l.ForeignHeld(DeviceKey{Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-1"}) {
		t.Error("admin access holds nic-1")
	}
	if l.UsageOf(DeviceKey{Pool: "n0", Device: "nic-0"}) != (l.UsageOf(DeviceKey{Pool: "n0", Device: "free"})) {
		t.Error("another driver's device counted as a gpulink device of the same name")
	}
	if l.KeepForPods(c, map[apitypes.UID]string{"p": "p"}) {
		t.Error("kept a claim of other drivers' devices only")
	}
	if l.ForeignHeld(key) {
		t.Error("nic-0 still held after its claim was forgotten")
	}
}
