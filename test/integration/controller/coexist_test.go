//go:build integration

package controller_test

import (
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// TestSchedulerCountsControllerAllocations runs kube-scheduler's own
// allocator (requests that tolerate gpulink's taint) next to the
// controller on one node. kube-scheduler must treat the controller's whole
// GPUs (dedicated results) as fully used; on devices that allow multiple
// allocations its own results are shares (shareID, consumedCapacity). The
// controller must count those shares: no whole GPU on a GPU holding them,
// but a share of its own next to them.
func TestSchedulerCountsControllerAllocations(t *testing.T) {
	e := setup(t, map[string]string{"co-p40": "p40-pcie-7.txt"})
	ctrl := e.startController(2)
	defer ctrl.stop()
	tolerate := []resourceapi.DeviceToleration{{Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}

	// The controller takes 6 of the 7 GPUs whole.
	e.template("six", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 6)}})
	six := e.claimsOf(e.startBound(e.newPod("six-pod", true, "six"), time.Minute))[0]
	var taken []string
	for _, r := range six.Status.Allocation.Devices.Results {
		taken = append(taken, r.Device)
	}

	// Two kube-scheduler pods: both land on the one GPU left, as shares.
	stock := controllertest.WholeRequest("g", 1)
	stock.Exactly.Tolerations = tolerate
	e.template("stock", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{stock}})
	var free string
	for _, name := range []string{"stock-a", "stock-b"} {
		c := e.claimsOf(e.startBound(e.newPod(name, false, "stock"), time.Minute))[0]
		r := c.Status.Allocation.Devices.Results[0]
		if slices.Contains(taken, r.Device) {
			t.Fatalf("kube-scheduler allocated %s, which the controller gave out whole", r.Device)
		}
		if r.ShareID == nil {
			t.Errorf("kube-scheduler's result on %s has no shareID", r.Device)
		}
		free = r.Device
	}

	// The controller: a whole GPU must wait, a share fits next to
	// kube-scheduler's shares on the same GPU.
	e.template("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	e.template("share", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}})
	e.createPod(e.newPod("gl-one", true, "one"))
	sh := e.claimsOf(e.startBound(e.newPod("gl-share", true, "share"), time.Minute))[0]
	if d := sh.Status.Allocation.Devices.Results[0].Device; d != free {
		t.Errorf("controller share on %s, want %s (the only GPU not given out whole)", d, free)
	}
	e.poll("whole-GPU pod waiting", 30*time.Second, func() bool { return hasEvent(e.events("gl-one", ""), "waiting: ") })
	if p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "gl-one", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("whole-GPU pod placed on a GPU holding shares (err %v)", err)
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}

	// Once the shares are gone the GPU is whole again.
	for _, name := range []string{"stock-a", "stock-b", "gl-share"} {
		e.deletePod(name)
	}
	one := e.claimsOf(e.waitBound("gl-one", 2*time.Minute))[0]
	if d := one.Status.Allocation.Devices.Results[0].Device; d != free {
		t.Errorf("whole GPU %s, want %s", d, free)
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}
