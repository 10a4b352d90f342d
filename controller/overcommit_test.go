package controller

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// A DeviceClass that opts in to memory over-commit
// (sharing.memoryOvercommitPercent) lets its shares of one GPU add up past
// the GPU's memory; a share of a class without the opt-in never joins
// them. 32Gi GPUs: two 20Gi over-committing shares bin-pack onto one GPU,
// a 20Gi share of the standard class goes elsewhere.
func TestMemoryOvercommitOptIn(t *testing.T) {
	over := planner.DeviceClasses()[1].DeepCopy()
	if over.Name != driver.DeviceClassShare {
		t.Fatalf("DeviceClasses()[1] is %s", over.Name)
	}
	over.Name = "gpu-share-overcommit.gpulink.dev"
	over.Spec.Config = append(over.Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver.Name, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"memoryOvercommitPercent":200}}`)}},
	}})
	h := newHarness(t, objs(append(classes(), over), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	shareOn := func(class string) resourceapi.DeviceClaim {
		r := controllertest.ShareRequest("s", "20Gi", "10")
		r.Exactly.DeviceClassName = class
		return resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}
	}
	device := func(name string) string {
		held, ok, err := gpuview.ClaimDevices(h.waitAllocated(name))
		if err != nil || !ok || len(held.Devices) != 1 {
			t.Fatalf("claim %s: %+v %v %v", name, held, ok, err)
		}
		return held.Devices[0]
	}
	h.claim("a", shareOn(over.Name))
	h.pod("pod-a", true, "a")
	first := device("a")
	h.claim("b", shareOn(over.Name))
	h.pod("pod-b", true, "b")
	if got := device("b"); got != first {
		t.Errorf("second over-committing share on %s, want it bin-packed onto %s (40Gi of 64Gi allowed)", got, first)
	}
	h.claim("c", shareOn(driver.DeviceClassShare))
	h.pod("pod-c", true, "c")
	if got := device("c"); got == first {
		t.Errorf("share of the standard class on %s, whose shares would then use 60Gi of its 32Gi", got)
	}
}

// Core shares never add up past 100 % of a GPU without an opt-in: the
// seed report on HAMi saw ten gpucores: 30 pods admitted and six running
// at 180 % of a GPU. Here 14 such shares on 4 GPUs: 12 are allocated,
// three per GPU (90 %), and two wait with a warning.
func TestCoreSharesNeverPast100Percent(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "node", "pcie-4.txt"))...).start()
	const n = 14
	for i := range n {
		name := fmt.Sprintf("c%02d", i)
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "3000Mi", "30")}})
		h.pod("pod-"+name, true, name)
	}
	var allocated int
	h.eventually("12 shares allocated", func() bool {
		allocated = 0
		for i := range n {
			if h.getClaim(fmt.Sprintf("c%02d", i)).Status.Allocation != nil {
				allocated++
			}
		}
		return allocated == 12
	})
	cores := map[string]int64{}
	for i := range n {
		c := h.getClaim(fmt.Sprintf("c%02d", i))
		if c.Status.Allocation == nil {
			if e := h.waitEvent(ns+"/pod-"+c.Name, report.ReasonWaiting); e.Type != corev1.EventTypeWarning {
				t.Errorf("claim %s waits with event %+v, want a warning", c.Name, e)
			}
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			q := r.ConsumedCapacity[driver.CapacityCores]
			cores[r.Device] += q.Value()
		}
	}
	for dev, sum := range cores {
		if sum > 100 {
			t.Errorf("shares of %s use %d%% of its cores", dev, sum)
		}
	}
	if len(cores) != 4 {
		t.Errorf("shares on %d GPUs, want all 4: %v", len(cores), cores)
	}
}
