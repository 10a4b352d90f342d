package controller

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apitypes "k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
)

func claimWith(uid, rv string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: apitypes.UID(uid), ResourceVersion: rv}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

func whole(dev string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver.Name, Pool: "n", Device: dev}
}

func share(dev, mem, cores string) resourceapi.DeviceRequestAllocationResult {
	id := apitypes.UID("3f1c2a10-0000-4000-8000-" + dev[len(dev)-1:] + "00000000000")
	r := whole(dev)
	r.ShareID = &id
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(mem), "cores": resource.MustParse(cores)}
	return r
}

var key0 = deviceKey{Pool: "n", Device: "gpu-0"}

func TestLedgerCountsWholeAndShares(t *testing.T) {
	l := newLedger()
	l.observe(claimWith("a", "1", whole("gpu-0")))
	l.observe(claimWith("b", "2", share("gpu-1", "2Gi", "20")))
	l.observe(claimWith("c", "3", share("gpu-1", "1Gi", "10")))
	// Another driver's result is not gpulink's business.
	other := whole("gpu-2")
	other.Driver = "other.example.com"
	l.observe(claimWith("d", "4", other))

	if got := l.usageOf(key0); !got.Exclusive {
		t.Errorf("gpu-0 usage %+v, want exclusive", got)
	}
	want := allocate.GPUUsage{Shares: 2, MemoryBytes: 3 << 30, Cores: 30}
	if got := l.usageOf(deviceKey{Pool: "n", Device: "gpu-1"}); got != want {
		t.Errorf("gpu-1 usage %+v, want %+v", got, want)
	}
	if got := l.usageOf(deviceKey{Pool: "n", Device: "gpu-2"}); got != (allocate.GPUUsage{}) {
		t.Errorf("gpu-2 usage %+v, want free", got)
	}
	// Deallocation and deletion free the devices.
	l.observe(claimWith("b", "5"))
	l.forget("c")
	if got := l.usageOf(deviceKey{Pool: "n", Device: "gpu-1"}); got != (allocate.GPUUsage{}) {
		t.Errorf("gpu-1 usage %+v after release, want free", got)
	}
}

func TestLedgerDoubleExclusiveStaysTaken(t *testing.T) {
	// Two claims holding one device whole (a double allocation by someone
	// else): releasing one must not free the device.
	l := newLedger()
	l.observe(claimWith("a", "1", whole("gpu-0")))
	l.observe(claimWith("b", "2", whole("gpu-0")))
	l.forget("a")
	if got := l.usageOf(key0); !got.Exclusive {
		t.Errorf("usage %+v, want still exclusive", got)
	}
	if ex, _ := l.holders(key0); ex != 1 {
		t.Errorf("%d exclusive holders, want 1", ex)
	}
}

func TestLedgerAssumptionSurvivesInformerLag(t *testing.T) {
	l := newLedger()
	// The informer knows the claim unallocated (rv 10).
	l.observe(claimWith("a", "10"))
	settle, _ := l.assume("a", []deviceUse{{Key: key0, Exclusive: true}})
	// While the write is in flight, the informer delivers the finalizer
	// update (rv 11, still unallocated): the assumption holds.
	l.observe(claimWith("a", "11"))
	if !l.usageOf(key0).Exclusive || !l.inFlight("a") {
		t.Fatal("assumed allocation dropped by an older informer view")
	}
	settle("12", true)
	// A stale view (rv 11 again, e.g. a resync) still does not win.
	l.observe(claimWith("a", "11"))
	if !l.usageOf(key0).Exclusive {
		t.Fatal("assumed allocation dropped by a stale view after the write")
	}
	// The informer catches up: the claim's own view replaces the assumption.
	l.observe(claimWith("a", "12", whole("gpu-0")))
	if l.inFlight("a") || !l.usageOf(key0).Exclusive {
		t.Fatalf("informer view not adopted: inFlight=%t usage=%+v", l.inFlight("a"), l.usageOf(key0))
	}
}

func TestLedgerAssumptionSettledAfterFastInformer(t *testing.T) {
	l := newLedger()
	settle, _ := l.assume("a", []deviceUse{{Key: key0, Exclusive: true}})
	// The informer shows the write before the write call returns.
	l.observe(claimWith("a", "7", whole("gpu-0")))
	settle("7", true)
	if l.inFlight("a") {
		t.Error("assumption kept although the informer already showed the write")
	}
	if !l.usageOf(key0).Exclusive {
		t.Error("device freed")
	}
}

func TestLedgerFailedWriteRestores(t *testing.T) {
	l := newLedger()
	settle, _ := l.assume("a", []deviceUse{{Key: key0, Exclusive: true}})
	settle("", false)
	if l.inFlight("a") || l.usageOf(key0).Exclusive {
		t.Error("failed write left the device taken")
	}
}

func TestRVAtLeast(t *testing.T) {
	for _, tc := range []struct {
		have, want string
		ok         bool
	}{{"10", "9", true}, {"9", "10", false}, {"10", "10", true}, {"x", "10", true}} {
		if got := rvAtLeast(tc.have, tc.want); got != tc.ok {
			t.Errorf("rvAtLeast(%q, %q) = %t, want %t", tc.have, tc.want, got, tc.ok)
		}
	}
}

// holders returns how many claims hold a device.
func (l *ledger) holders(key deviceKey) (exclusive, shares int) {
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
