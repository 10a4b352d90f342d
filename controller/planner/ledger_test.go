package planner

import (
	"testing"

	apitypes "k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

var key0 = DeviceKey{Pool: "n", Device: "gpu-0"}

func TestLedgerCountsWholeAndShares(t *testing.T) {
	l := NewLedger()
	l.Observe(controllertest.ClaimWith("a", "1", controllertest.WholeResult("gpu-0")))
	l.Observe(controllertest.ClaimWith("b", "2", controllertest.ShareResult("gpu-1", "2Gi", "20")))
	l.Observe(controllertest.ClaimWith("c", "3", controllertest.ShareResult("gpu-1", "1Gi", "10")))
	// Another driver's result is not gpulink's business.
	other := controllertest.WholeResult("gpu-2")
	other.Driver = "other.example.com"
	l.Observe(controllertest.ClaimWith("d", "4", other))

	if got := l.UsageOf(key0); !got.Exclusive {
		t.Errorf("gpu-0 usage %+v, want exclusive", got)
	}
	want := allocate.GPUUsage{Shares: 2, MemoryBytes: 3 << 30, Cores: 30}
	if got := l.UsageOf(DeviceKey{Pool: "n", Device: "gpu-1"}); got != want {
		t.Errorf("gpu-1 usage %+v, want %+v", got, want)
	}
	if got := l.UsageOf(DeviceKey{Pool: "n", Device: "gpu-2"}); got != (allocate.GPUUsage{}) {
		t.Errorf("gpu-2 usage %+v, want free", got)
	}
	// Deallocation and deletion free the devices.
	l.Observe(controllertest.ClaimWith("b", "5"))
	l.Forget("c")
	if got := l.UsageOf(DeviceKey{Pool: "n", Device: "gpu-1"}); got != (allocate.GPUUsage{}) {
		t.Errorf("gpu-1 usage %+v after release, want free", got)
	}
}

func TestLedgerDoubleExclusiveStaysTaken(t *testing.T) {
	// Two claims holding one device whole (a double allocation by someone
	// else): releasing one must not free the device.
	l := NewLedger()
	l.Observe(controllertest.ClaimWith("a", "1", controllertest.WholeResult("gpu-0")))
	l.Observe(controllertest.ClaimWith("b", "2", controllertest.WholeResult("gpu-0")))
	l.Forget("a")
	if got := l.UsageOf(key0); !got.Exclusive {
		t.Errorf("usage %+v, want still exclusive", got)
	}
	if ex, _ := l.holders(key0); ex != 1 {
		t.Errorf("%d exclusive holders, want 1", ex)
	}
}

func TestLedgerAssumptionSurvivesInformerLag(t *testing.T) {
	l := NewLedger()
	// The informer knows the claim unallocated (rv 10).
	l.Observe(controllertest.ClaimWith("a", "10"))
	settle, _ := l.Assume("a", []DeviceUse{{Key: key0, Exclusive: true}})
	// While the write is in flight, the informer delivers the finalizer
	// update (rv 11, still unallocated): the assumption holds.
	l.Observe(controllertest.ClaimWith("a", "11"))
	if !l.UsageOf(key0).Exclusive || !l.InFlight("a") {
		t.Fatal("assumed allocation dropped by an older informer view")
	}
	settle("12", true)
	// A stale view (rv 11 again, e.g. a resync) still does not win.
	l.Observe(controllertest.ClaimWith("a", "11"))
	if !l.UsageOf(key0).Exclusive {
		t.Fatal("assumed allocation dropped by a stale view after the write")
	}
	// The informer catches up: the claim's own view replaces the assumption.
	l.Observe(controllertest.ClaimWith("a", "12", controllertest.WholeResult("gpu-0")))
	if l.InFlight("a") || !l.UsageOf(key0).Exclusive {
		t.Fatalf("informer view not adopted: inFlight=%t usage=%+v", l.InFlight("a"), l.UsageOf(key0))
	}
}

func TestLedgerAssumptionSettledAfterFastInformer(t *testing.T) {
	l := NewLedger()
	settle, _ := l.Assume("a", []DeviceUse{{Key: key0, Exclusive: true}})
	// The informer shows the write before the write call returns.
	l.Observe(controllertest.ClaimWith("a", "7", controllertest.WholeResult("gpu-0")))
	settle("7", true)
	if l.InFlight("a") {
		t.Error("assumption kept although the informer already showed the write")
	}
	if !l.UsageOf(key0).Exclusive {
		t.Error("device freed")
	}
}

func TestLedgerFailedWriteRestores(t *testing.T) {
	l := NewLedger()
	settle, _ := l.Assume("a", []DeviceUse{{Key: key0, Exclusive: true}})
	settle("", false)
	if l.InFlight("a") || l.UsageOf(key0).Exclusive {
		t.Error("failed write left the device taken")
	}
}

func TestRVAtLeast(t *testing.T) {
	for _, tc := range []struct {
		have, want string
		ok         bool
	}{{"10", "9", true}, {"9", "10", false}, {"10", "10", true}, {"x", "10", true}} {
		if got := ResourceVersionAtLeast(tc.have, tc.want); got != tc.ok {
			t.Errorf("ResourceVersionAtLeast(%q, %q) = %t, want %t", tc.have, tc.want, got, tc.ok)
		}
	}
}

// holders returns how many claims hold a device.
func (l *Ledger) holders(key DeviceKey) (exclusive, shares int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.claims {
		for _, u := range c.uses {
			if u.Key == key {
				if u.Exclusive {
					exclusive++
				} else {
					shares++
				}
			}
		}
	}
	return exclusive, shares
}

// A deleted claim's devices stay counted, whole GPUs and shares' consumed
// capacity alike, until the last pod it is kept for ends.
func TestLedgerKeepsDeletedClaimForPods(t *testing.T) {
	l := NewLedger()
	a := controllertest.ClaimWith("a", "1", controllertest.WholeResult("gpu-0"), controllertest.ShareResult("gpu-1", "2Gi", "20"))
	l.Observe(a)
	l.Observe(controllertest.ClaimWith("b", "2", controllertest.ShareResult("gpu-1", "1Gi", "10")))
	if !l.KeepForPods(a, map[apitypes.UID]string{"p1": "one", "p2": "two"}) {
		t.Fatal("claim with devices and pods not kept")
	}
	gpu1 := DeviceKey{Pool: "n", Device: "gpu-1"}
	wantShared := allocate.GPUUsage{Shares: 2, MemoryBytes: 3 << 30, Cores: 30}
	check := func(when string, gpu0 allocate.GPUUsage, gpu1Want allocate.GPUUsage) {
		t.Helper()
		if got := l.UsageOf(key0); got != gpu0 {
			t.Errorf("%s: gpu-0 usage %+v, want %+v", when, got, gpu0)
		}
		if got := l.UsageOf(gpu1); got != gpu1Want {
			t.Errorf("%s: gpu-1 usage %+v, want %+v", when, got, gpu1Want)
		}
	}
	check("kept", allocate.GPUUsage{Exclusive: true}, wantShared)
	if k, ok := l.KeptClaim("a"); !ok || len(k.Pods) != 2 || k.Allocation == nil {
		t.Errorf("keptClaim(a) = %+v, %v; want two pods and the allocation", k, ok)
	}
	// Another claim's pod ending changes nothing; one of two pods ending
	// neither.
	if r := l.KeptPodEnded("", "other"); len(r) != 0 {
		t.Errorf("unrelated pod released %v", r)
	}
	if r := l.KeptPodEnded("", "p1"); len(r) != 0 {
		t.Errorf("first of two pods released %v", r)
	}
	check("one pod left", allocate.GPUUsage{Exclusive: true}, wantShared)
	if r := l.KeptPodEnded("", "p2"); len(r) != 1 || r["a"] {
		t.Errorf("last pod released %v, want a, not recorded", r)
	}
	check("released", allocate.GPUUsage{}, allocate.GPUUsage{Shares: 1, MemoryBytes: 1 << 30, Cores: 10})
	if _, ok := l.KeptClaim("a"); ok {
		t.Error("released claim still kept")
	}
}

// A deleted claim with no pod to keep it for, or no gpulink device, is
// forgotten as before.
func TestLedgerKeepNothing(t *testing.T) {
	l := NewLedger()
	a := controllertest.ClaimWith("a", "1", controllertest.WholeResult("gpu-0"))
	l.Observe(a)
	if l.KeepForPods(a, nil) {
		t.Error("kept a claim for no pod")
	}
	if got := l.UsageOf(key0); got != (allocate.GPUUsage{}) {
		t.Errorf("usage %+v, want free", got)
	}
	other := controllertest.WholeResult("gpu-0")
	other.Driver = "other.example.com"
	b := controllertest.ClaimWith("b", "2", other)
	l.Observe(b)
	if l.KeepForPods(b, map[apitypes.UID]string{"p": "p"}) {
		t.Error("kept a claim without gpulink devices")
	}
	if l.Held("b") {
		t.Error("claim without gpulink devices still in the ledger")
	}
}

// A hold record replaces the kept claim in one step: the device is counted
// by exactly one holder afterwards, and freed when the record goes.
func TestLedgerRecordReplacesKeptClaim(t *testing.T) {
	l := NewLedger()
	a := controllertest.ClaimWith("a", "1", controllertest.WholeResult("gpu-0"))
	l.Observe(a)
	l.KeepForPods(a, map[apitypes.UID]string{"p": "p"})
	rec := controllertest.ClaimWith("rec", "5")
	// A record that counts nothing (unreadable) does not drop the kept claim.
	l.ObserveRecord(rec, nil, "a")
	if _, ok := l.KeptClaim("a"); !ok {
		t.Fatal("kept claim dropped by a record holding nothing")
	}
	l.ObserveRecord(rec, []DeviceUse{{Key: key0, Exclusive: true}}, "a")
	if _, ok := l.KeptClaim("a"); ok {
		t.Error("kept claim still there once its record counts the devices")
	}
	if ex, _ := l.holders(key0); ex != 1 {
		t.Errorf("%d exclusive holders of gpu-0, want 1 (the record)", ex)
	}
	// The pod ending now is the record's business (syncHoldRecord); the
	// ledger has nothing kept for it.
	if r := l.KeptPodEnded("", "p"); len(r) != 0 {
		t.Errorf("released %v after the record took over", r)
	}
	if got := l.UsageOf(key0); !got.Exclusive {
		t.Errorf("usage %+v, want exclusive while the record exists", got)
	}
	l.Forget("rec")
	if got := l.UsageOf(key0); got != (allocate.GPUUsage{}) {
		t.Errorf("usage %+v after the record was deleted, want free", got)
	}
}
