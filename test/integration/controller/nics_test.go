//go:build integration

package controller_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// publishNICs is the test suite's own NIC publisher: it creates the slice
// of the fake driver controllertest.NICDriver on an API-only node (and its
// DeviceClass), as an RDMA NIC DRA driver's kubelet plugin would, and
// deletes the slice when the test ends.
func (e *env) publishNICs(node string, nics []controllertest.NIC) {
	e.t.Helper()
	if _, err := e.client.ResourceV1().DeviceClasses().Create(e.ctx, controllertest.NICDeviceClass(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	s := controllertest.NICSlice(node, nics)
	if _, err := e.client.ResourceV1().ResourceSlices().Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.client.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
}

// TestGPUsWithNICs: a pod whose claim asks for 2 gpulink GPUs and 2 NICs
// of another driver with matchAttribute resource.kubernetes.io/pcieRoot
// (GPUDirect RDMA) is allocated whole by the controller, with GPUs whose
// root complex has two free NICs and those NICs as results of the NIC
// driver, and kube-scheduler binds it to that node. The API server
// validates the allocation as it stores it.
func TestGPUsWithNICs(t *testing.T) {
	e := setup(t, nil)
	topo, err := controllertest.WithPCIeRoots(fixture(t, "pcie-switch-8.txt"),
		[]string{"pci0000:00", "pci0000:00", "pci0000:20", "pci0000:20", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"})
	if err != nil {
		t.Fatal(err)
	}
	e.addNode("rdma-a", topo)
	// One NIC under each root but 80, which has two.
	e.publishNICs("rdma-a", []controllertest.NIC{
		{Name: "nic-0", PCIeRoot: "pci0000:00"}, {Name: "nic-1", PCIeRoot: "pci0000:20"},
		{Name: "nic-2", PCIeRoot: "pci0000:80"}, {Name: "nic-3", PCIeRoot: "pci0000:80"}, {Name: "nic-4", PCIeRoot: "pci0000:a0"},
	})
	ctrl := e.startController(2)
	defer ctrl.stop()

	e.template("gpus-nics", resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 2), controllertest.NICRequest("nic", 2)},
		Constraints: []resourceapi.DeviceConstraint{controllertest.MatchPCIeRoot()},
	})
	p := e.startBound(e.newPod("rdma", true, "gpus-nics"), time.Minute)
	if p.Spec.NodeName != "rdma-a" {
		t.Fatalf("pod bound to %s, want rdma-a", p.Spec.NodeName)
	}
	c := e.claimsOf(p)[0]
	var gpus, nics []string
	for _, r := range c.Status.Allocation.Devices.Results {
		switch r.Driver {
		case driver.Name:
			gpus = append(gpus, r.Device)
		case controllertest.NICDriver:
			if r.Pool != "rdma-a" || r.Request != "nic" {
				t.Errorf("NIC result %+v: want pool rdma-a, request nic", r)
			}
			nics = append(nics, r.Device)
		default:
			t.Errorf("result of driver %s", r.Driver)
		}
	}
	if !slices.Equal(gpus, []string{"gpu-4", "gpu-5"}) || !slices.Equal(nics, []string{"nic-2", "nic-3"}) {
		t.Errorf("GPUs %v and NICs %v, want gpu-4,gpu-5 and nic-2,nic-3 (the root with two NICs)", gpus, nics)
	}
	if nodeOf(c) != "rdma-a" {
		t.Errorf("allocation's node selector names %q", nodeOf(c))
	}
	// Events are recorded asynchronously, sometimes after the pod is bound.
	if ev := e.waitEvent("rdma", report.ReasonAllocated, 30*time.Second); !strings.Contains(ev, "nic=nic-2,nic-3") {
		t.Errorf("event %q: want the allocation naming the NICs", ev)
	}

	// The two NICs are held now: a second such pod waits, and says why.
	e.createPod(e.newPod("rdma-2", true, "gpus-nics"))
	e.poll("rdma-2 waiting event", time.Minute, func() bool {
		p2, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "rdma-2", metav1.GetOptions{})
		return err == nil && hasEvent(e.events("rdma-2", p2.UID), "no 2 free devices of DeviceClass "+controllertest.NICClass)
	})
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}

	// Once the first pod finishes, its GPUs and NICs are free again. The
	// controller keeps the nodes a waiting GPU+NIC pod had no room on
	// between its retries (planner's waitingMisses): the NICs let go must
	// drop that answer, and the waiting pod gets them.
	e.setPhase("rdma", corev1.PodSucceeded)
	p2 := e.waitBound("rdma-2", 2*time.Minute)
	nics = nil
	for _, c := range e.claimsOf(p2) {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == controllertest.NICDriver {
				nics = append(nics, r.Device)
			}
		}
	}
	if !slices.Equal(nics, []string{"nic-2", "nic-3"}) {
		t.Errorf("the pod that waited got NICs %v, want nic-2,nic-3 (the first pod's)", nics)
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}
