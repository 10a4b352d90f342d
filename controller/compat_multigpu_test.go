package controller

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// HAMi's nvidia.com/gpu: 2 with nvidia.com/gpumem: 8000 means 8000 MiB on
// each of two GPUs. The translation asks for it as one request of the
// share class with count 2 and the memory as capacity; the allocator
// places the two shares on two different GPUs, even when one GPU would
// hold both by memory and cores (16Gi GPUs, 2 x 8000Mi fit on one).
func TestTranslatedTwoGPUSharesOnDistinctGPUs(t *testing.T) {
	tr := compat.Translator{Config: compat.DefaultConfig()}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "main", Image: "busybox",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2"), "nvidia.com/gpumem": resource.MustParse("8000")}},
	}}}}
	res, err := tr.Translate(pod)
	if err != nil {
		t.Fatalf("translating nvidia.com/gpu: 2 + nvidia.com/gpumem: 8000: %v", err)
	}
	if res == nil || len(res.Claims) != 1 || len(res.Templates) != 1 {
		t.Fatalf("want one claim from one template, got %+v", res)
	}
	spec := res.Templates[res.Claims[0].Template]
	reqs := spec.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.Count != 2 {
		t.Fatalf("translated requests %+v, want one request with count 2", reqs)
	}

	h := newHarness(t, objs(classes(), gpuNode(t, "node", "pcie-4.txt"))...).start()
	h.claim("pair", spec.Spec.Devices)
	h.pod("pod-pair", true, "pair")
	held, ok, err := gpuview.ClaimDevices(h.waitAllocated("pair"))
	if err != nil || !ok {
		t.Fatalf("claim pair: %+v %v %v", held, ok, err)
	}
	if len(held.Devices) != 2 || held.Devices[0] == held.Devices[1] {
		t.Fatalf("shares on %v, want two different GPUs", held.Devices)
	}
	for _, r := range h.getClaim("pair").Status.Allocation.Devices.Results {
		if q := r.ConsumedCapacity[driver.CapacityMemory]; q.Cmp(resource.MustParse("8000Mi")) != 0 {
			t.Errorf("result on %s consumes memory %s, want 8000Mi", r.Device, q.String())
		}
	}
}

// HAMi's use_memory_fraction.yaml (nvidia.com/gpu: 2 with
// gpumem-percentage: 50) on the aliyun V100 box, where shares already sit
// on gpu-0 and gpu-5, joined only by SYS. Placed one by one, each share
// packed onto a shared GPU: gpu-0 and gpu-5, a SYS pair, while NV2 pairs
// were free. The two shares of one claim are one job: they get a
// link-minimal pair (weakest link first), then packed (one of the shared
// GPUs with its NV2 partner) (issue 18, defect 2).
func TestTranslatedTwoGPUSharesGetNVLinkedPair(t *testing.T) {
	const fixture = "v100-sxm2-8-aliyun-sccgn6.txt"
	topo := fixtureTopology(t, fixture)
	tr := compat.Translator{Config: compat.DefaultConfig(), Inventory: staticSizes{32 << 30}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "main", Image: "busybox",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2"), "nvidia.com/gpumem-percentage": resource.MustParse("50")}},
	}}}}
	res, err := tr.Translate(pod)
	if err != nil {
		t.Fatal(err)
	}
	spec := res.Templates[res.Claims[0].Template]

	h := newHarness(t, objs(classes(), gpuNode(t, "v100", fixture))...).start()
	// The shares already there, pinned by selectors.
	for _, gpu := range []int{0, 5} {
		name := fmt.Sprintf("on-%d", gpu)
		first := controllertest.ShareRequest("s", "4Gi", "25")
		first.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(`device.attributes["gpu.gpulink.dev"].index == %d`, gpu)}}}
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{first}})
		h.pod("pod-"+name, true, name)
		if got := devicesOf(h.waitAllocated(name)); len(got) != 1 || got[0] != fmt.Sprintf("gpu-%d", gpu) {
			t.Fatalf("share %s on %v", name, got)
		}
	}

	h.claim("pair", spec.Spec.Devices)
	h.pod("pod-pair", true, "pair")
	held, ok, err := gpuview.ClaimDevices(h.waitAllocated("pair"))
	if err != nil || !ok {
		t.Fatalf("claim pair: %+v %v %v", held, ok, err)
	}
	pos := indices(t, held.Devices)
	if len(pos) != 2 {
		t.Fatalf("shares on %v, want two GPUs", held.Devices)
	}
	if w := topo.WeakestLink(pos); w < topology.NVLink(2) || (!slices.Contains(pos, 0) && !slices.Contains(pos, 5)) {
		t.Errorf("shares on %v joined by %s; want an NV2 pair with one of the shared GPUs 0 and 5", held.Devices, w)
	}
}

type staticSizes []int64

func (s staticSizes) MemorySizes() []int64 { return s }
