package controller

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// Two nodes of 4 GPUs; node a has 4 CPUs, node b plenty. The first pod (a
// GPU and 2 CPUs) goes to a, the first by name. The second asks the same:
// ranked by GPUs alone it packs onto a, which leaves a's last two GPUs
// with no CPU for pods like these; ranked by stranding (the recent shape
// is a GPU and 2 CPUs) it goes to b, where nothing is stranded.
func TestRankByStrandingCountsCPU(t *testing.T) {
	for _, tc := range []struct {
		stranding bool
		want      string
	}{{false, "a"}, {true, "b"}} {
		objs := objs(classes(), gpuNode(t, "a", "pcie-4.txt"), gpuNode(t, "b", "pcie-4.txt"))
		for _, o := range objs {
			if n, ok := o.(*corev1.Node); ok && n.Name == "a" {
				n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("4")
			}
		}
		h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, RankByStranding: tc.stranding,
			Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}}, objs...).start()
		for i, name := range []string{"c0", "c1"} {
			h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
			h.podAsking("pod-"+name, "2", name)
			held, ok, err := gpuview.ClaimDevices(h.waitAllocated(name))
			if err != nil || !ok {
				t.Fatalf("claim %s: %+v %v %v", name, held, ok, err)
			}
			want := "a"
			if i == 1 {
				want = tc.want
			}
			if held.Node != want {
				t.Errorf("rank by stranding %v: claim %s on node %s, want %s", tc.stranding, name, held.Node, want)
			}
		}
	}
}

// podAsking creates a gated pod with one claim whose container requests
// cpu.
func (h *harness) podAsking(name, cpu, claim string) {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: claim, ResourceClaimName: ptr.To(claim)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// hostLeft follows the Node informer: a node it has not seen is read from
// the lister once, a new allocatable counts once the handler records it,
// pods counted on the node are subtracted, and a deleted node is unknown.
func TestHostLeftFollowsNodeObject(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	fit := planner.NewFitTracker()
	f := &planner.NodeFilter{Nodes: corelisters.NewNodeLister(indexer), Fit: fit}
	node := controllertest.Node("n")
	node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("8")
	node.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("64Gi")
	if err := indexer.Add(node); err != nil {
		t.Fatal(err)
	}
	want := func(step string, cpu, mem int64) {
		t.Helper()
		got := f.HostLeft("n")
		if got == nil || *got != (allocate.Host{CPUMilli: cpu, MemoryBytes: mem}) {
			t.Fatalf("%s: hostLeft = %+v, want %d mCPU and %d bytes", step, got, cpu, mem)
		}
	}
	want("first read, from the lister", 8000, 64<<30)
	fit.Observe(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p"},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3"), corev1.ResourceMemory: resource.MustParse("4Gi")}}}}}})
	want("a pod counted", 5000, 60<<30)
	grown := node.DeepCopy()
	grown.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("16")
	f.Allocatable.Set(grown)
	want("allocatable grown", 13000, 60<<30)
	noMemory := grown.DeepCopy()
	delete(noMemory.Status.Allocatable, corev1.ResourceMemory)
	f.Allocatable.Set(noMemory)
	if got := f.HostLeft("n"); got != nil {
		t.Errorf("no allocatable memory: hostLeft = %+v, want nil (unknown)", got)
	}
	if err := indexer.Delete(node); err != nil {
		t.Fatal(err)
	}
	f.Allocatable.Forget("n")
	if got := f.HostLeft("n"); got != nil {
		t.Errorf("deleted node: hostLeft = %+v, want nil", got)
	}
}

// The controller's Node handlers keep the allocatable a decision ranks
// with current, status-only updates included.
func TestNodeHandlersKeepAllocatable(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
	node, err := h.client.CoreV1().Nodes().Get(h.ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("7")
	if _, err := h.client.CoreV1().Nodes().UpdateStatus(h.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("allocatable CPU 7 recorded", func() bool {
		got, ok, known := h.ctrl.filter.Allocatable.Of("a")
		return known && ok && got.CPUMilli == 7000
	})
	if err := h.client.CoreV1().Nodes().Delete(h.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("deleted node forgotten", func() bool {
		_, _, known := h.ctrl.filter.Allocatable.Of("a")
		return !known
	})
}

// With ranking by stranding, a change of a node's CPU or memory left
// (a pod with requests counted on it, its allocatable changed) moves the
// node's generation, so its kept scores are computed again; a pod without
// requests does not, and without the ranking nothing does.
func TestHostChangesTouchTheLedger(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("rankByStranding=%t", on), func(t *testing.T) {
			h := newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true, RankByStranding: on}, objs(classes(), gpuNode(t, "a", "pcie-4.txt"))...).start()
			c := h.ctrl
			n := c.inv.Node("a")
			if n == nil {
				t.Fatal("node a has no inventory")
			}
			gen := func() uint64 {
				out := make([]uint64, 1)
				c.ledger.Generations([]*planner.NodeInventory{n}, out)
				return out[0]
			}
			before := gen()
			c.fit.Observe(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "d", UID: "bare"},
				Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "c"}}}})
			if got := gen(); got != before {
				t.Errorf("a pod without requests moved the generation %d -> %d", before, got)
			}
			c.fit.Observe(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "d", UID: "cpu"},
				Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}}}}})
			afterPod := gen()
			node := controllertest.Node("a")
			node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("5")
			c.filter.Allocatable.Set(node)
			afterNode := gen()
			if on && (afterPod == before || afterNode == afterPod) {
				t.Errorf("generations %d, %d, %d: a pod with CPU and a new allocatable must each move it", before, afterPod, afterNode)
			}
			if !on && afterNode != before {
				t.Errorf("without the ranking the generation moved %d -> %d", before, afterNode)
			}
		})
	}
}

// A controller that starts with pods already running ranks as one that
// decided them: the demand mix is seeded from their shapes (Planner.Seed).
// Node a runs a pod with a GPU and 2 of its 4 CPUs; a new pod asking the
// same goes to b, where it strands nothing. Without the seed the first
// decision has no mix, ranks by GPUs alone and packs it onto a, whose
// last two GPUs are then left without CPU.
func TestRestartRanksWithRunningPods(t *testing.T) {
	objs := objs(classes(), gpuNode(t, "a", "pcie-4.txt"), gpuNode(t, "b", "pcie-4.txt"))
	for _, o := range objs {
		if n, ok := o.(*corev1.Node); ok && n.Name == "a" {
			n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("4")
		}
	}
	running := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "running", Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{
			NodeName: "a",
			Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "c0", ResourceClaimName: ptr.To("c0")}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c0", Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{NodeSelector: planner.NodeSelectorFor("a"), AllocationTimestamp: ptr.To(metav1.Now()),
				Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "g", Driver: driver.Name, Pool: "a", Device: "gpu-0"}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: running.Name, UID: running.UID}},
		},
	}
	objs = append(objs, running, claim)
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, RankByStranding: true,
		Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}}, objs...).start()
	h.claim("c1", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.podAsking("pod-c1", "2", "c1")
	held, ok, err := gpuview.ClaimDevices(h.waitAllocated("c1"))
	if err != nil || !ok {
		t.Fatalf("claim c1: %+v %v %v", held, ok, err)
	}
	if held.Node != "b" {
		t.Errorf("claim c1 on node %s, want b (the running pod's shape seeds the mix)", held.Node)
	}
}
