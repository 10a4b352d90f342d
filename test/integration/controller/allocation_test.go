//go:build integration

package controller_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// TestBestSetsAndHandOff allocates 1, 2, 4 and 8 GPUs and shares on a V100
// (NVLink hybrid cube mesh), a P40 (PCIe) and a DGX A100 (NVSwitch) node,
// and checks the sets, the hand-off to kube-scheduler and the events.
func TestBestSetsAndHandOff(t *testing.T) {
	e := setup(t, map[string]string{
		"v100-a": "v100-sxm2-8-aliyun-sccgn6.txt",
		"p40-a":  "p40-pcie-7.txt",
		"a100-a": "dgx-a100.txt",
	})
	ctrl := e.startController(4)
	defer ctrl.stop()

	e.template("quad-nvlink", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 4)},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
	})
	e.template("eight", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 8)}})
	e.template("two", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	e.template("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}})
	e.template("share", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "2Gi", "20")}})

	type step struct {
		pod, tpl string
		gated    bool
		onNode   string // pod nodeSelector
		check    func(t *testing.T, c *resourceapi.ResourceClaim)
	}
	steps := []step{
		{pod: "quad", tpl: "quad-nvlink", gated: true, onNode: "v100-a", check: func(t *testing.T, c *resourceapi.ResourceClaim) {
			if n := len(c.Status.Allocation.Devices.Results); n != 4 {
				t.Errorf("quad: %d devices", n)
			}
			if w := e.weakest(c); !w.IsNVLink() {
				t.Errorf("quad on V100: weakest link %s, want every pair NVLink", w)
			}
		}},
		{pod: "eight", tpl: "eight", gated: true, check: func(t *testing.T, c *resourceapi.ResourceClaim) {
			if nodeOf(c) != "a100-a" {
				t.Errorf("8 GPUs on %s, want the only node with 8 free GPUs, a100-a", nodeOf(c))
			}
		}},
		{pod: "two", tpl: "two", gated: true, check: func(t *testing.T, c *resourceapi.ResourceClaim) {
			if w := e.weakest(c); !w.IsNVLink() {
				t.Errorf("pair on %s has weakest link %s, want an NVLink pair (the V100's free quad has them)", nodeOf(c), w)
			}
		}},
		{pod: "one-ungated", tpl: "one", gated: false},
		{pod: "pcie-pair", tpl: "two", gated: true, onNode: "p40-a", check: func(t *testing.T, c *resourceapi.ResourceClaim) {
			if w := e.weakest(c); w.String() != "PIX" {
				t.Errorf("pair on P40 has weakest link %s, want PIX (same PCIe switch)", w)
			}
		}},
		{pod: "share", tpl: "share", gated: true, check: func(t *testing.T, c *resourceapi.ResourceClaim) {
			r := c.Status.Allocation.Devices.Results[0]
			mem := r.ConsumedCapacity[driver.CapacityMemory]
			if r.ShareID == nil || mem.String() != "2Gi" {
				t.Errorf("share result %+v, want shareID and 2Gi memory", r)
			}
		}},
	}
	for _, s := range steps {
		p := e.newPod(s.pod, s.gated, s.tpl)
		if s.onNode != "" {
			p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: s.onNode}
		}
		created := e.createPod(p)
		start := time.Now()
		bound := e.waitBound(s.pod, time.Minute)
		if len(bound.Spec.SchedulingGates) != 0 {
			t.Errorf("%s: bound with gates %v", s.pod, bound.Spec.SchedulingGates)
		}
		claims := e.claimsOf(bound)
		if len(claims) != 1 || claims[0].Status.Allocation == nil {
			t.Fatalf("%s: claims %v not allocated", s.pod, claims)
		}
		c := claims[0]
		if nodeOf(c) != bound.Spec.NodeName {
			t.Errorf("%s: allocated on %s but bound to %s", s.pod, nodeOf(c), bound.Spec.NodeName)
		}
		if s.onNode != "" && bound.Spec.NodeName != s.onNode {
			t.Errorf("%s: bound to %s, want %s", s.pod, bound.Spec.NodeName, s.onNode)
		}
		if c.Status.Allocation.AllocationTimestamp == nil || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != created.UID {
			t.Errorf("%s: allocation timestamp %v, reservedFor %+v", s.pod, c.Status.Allocation.AllocationTimestamp, c.Status.ReservedFor)
		}
		if s.check != nil {
			s.check(t, c)
		}
		t.Logf("%s: %d device(s) on %s, bound after %s", s.pod, len(c.Status.Allocation.Devices.Results), bound.Spec.NodeName, time.Since(start).Round(time.Millisecond))
	}
	e.poll("allocation events", 30*time.Second, func() bool { return hasEvent(e.events("quad", ""), "allocated") })
	t.Logf("events of pod quad: %q", e.events("quad", ""))

	// Nothing can give 8 NVLink GPUs on the P40 box: the pod waits, gated,
	// with an event saying why.
	e.template("eight-nvlink", resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 8)},
		Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
	})
	p := e.newPod("impossible", true, "eight-nvlink")
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "p40-a"}
	e.createPod(p)
	e.poll("waiting event", 30*time.Second, func() bool { return hasEvent(e.events("impossible", ""), "waiting: ") })
	got, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "impossible", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.SchedulingGates) != 1 {
		t.Errorf("waiting pod lost its gate: %v", got.Spec.SchedulingGates)
	}
	t.Logf("events of pod impossible: %q", e.events("impossible", ""))
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}
