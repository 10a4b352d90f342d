package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// A claim whose selector is costly to evaluate (two comprehensions over
// 300-number lists, about 630,000 of the API's 1,000,000 cost units) no
// longer holds every other pod's decision: its evaluation runs before
// the decision lock, an attempt stops after SelectorAttempt with a
// SelectorsCostly Warning, and another pod's claim is allocated
// meanwhile.
func TestCostlySelectorDoesNotHoldOthers(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, SelectorAttempt: 200 * time.Millisecond}, objs(classes(), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	nums := make([]string, 300)
	for i := range nums {
		nums[i] = fmt.Sprint(i)
	}
	list := "[" + strings.Join(nums, ",") + "]"
	h.claim("costly", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(`%s.all(x, %s.all(y, x + y >= 0))`, list, list)}}},
	}}}})
	h.claim("plain", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}})
	h.pod("slow", true, "costly")
	h.pod("quick", true, "plain")
	h.waitAllocated("plain")
	h.waitUngated("quick")
	h.waitEvent(ns+"/slow", report.ReasonSelectorsCostly)
}
