package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
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
