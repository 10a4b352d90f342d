package controller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/allocate"
)

// withResources sets a node's allocatable (and capacity) in gpuNode's objects.
func withResources(objs []runtime.Object, l corev1.ResourceList) []runtime.Object {
	for _, o := range objs {
		if n, ok := o.(*corev1.Node); ok {
			n.Status.Allocatable = l.DeepCopy()
			n.Status.Capacity = l.DeepCopy()
		}
	}
	return objs
}

// The DGX A100 (NVSwitch) is the best node for a pair, but lacks the CPU
// the pod asks for: the controller allocates on the V100 node right away,
// and says why when no node fits.
func TestNodeFitSkipsNodeWithoutCPU(t *testing.T) {
	h := newHarness(t, objs(classes(),
		withResources(gpuNode(t, "a100", "dgx-a100.txt"), controllertest.ResourceList("cpu", "1", "memory", "64Gi", "pods", "110")),
		gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("small", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("small", true, "small")
	if n := allocatedNode(h.waitAllocated("small")); n != "a100" {
		t.Fatalf("pod without CPU requests on %s, want a100 (best links)", n)
	}
	h.claim("c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: controllertest.ResourceList("cpu", "2")}}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: ptr.To("c")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: "gpu.gpulink.dev/allocation"}}}}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := allocatedNode(h.waitAllocated("c")); n != "v100" {
		t.Errorf("pod asking for 2 CPUs allocated on %s, want v100 (a100 has 1 CPU)", n)
	}

	h.claim("huge", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	p = p.DeepCopy()
	p.Name, p.UID = "huge", uuid.NewUUID()
	p.Spec.Containers[0].Resources.Requests = controllertest.ResourceList("memory", "2Ti")
	p.Spec.ResourceClaims[0].ResourceClaimName = ptr.To("huge")
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e := h.waitEvent(ns+"/huge", report.ReasonWaiting)
	if !contains(e.Note, "0/2 nodes: 2 Insufficient memory") || !contains(e.Note, "node a100: Insufficient memory") {
		t.Errorf("waiting event %q does not count the nodes the fit filter rejected", e.Note)
	}
	if _, released := h.rec.find(ns+"/cpu", report.ReasonReleased); released {
		t.Error("the pod asking for CPU was released and retried instead of placed on v100 at once")
	}
}

// A pod with a 1-GPU and a 4-GPU claim: ranked by its first request alone,
// binpack would pick the fuller P40 box; ranked as a whole, the quad's
// NVLink on the V100 node wins.
func TestSeveralClaimsRankedByWholePod(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "p40", "p40-pcie-7.txt"), gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	h.claim("quad", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	h.pod("p", true, "one", "quad")
	if n := allocatedNode(h.waitAllocated("quad")); n != "v100" {
		t.Errorf("pod placed on %s, want v100", n)
	}
	// The same pod's first request alone goes to the P40 box (binpack).
	var states []*allocate.NodeState
	for _, inv := range h.ctrl.inv.All() {
		states = append(states, &allocate.NodeState{Name: inv.Node, Topology: inv.Topo, Usage: make([]allocate.GPUUsage, inv.Topo.Len())})
	}
	if r, err := allocate.ChooseNode(states, allocate.Request{GPUs: 1}, allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}); err != nil || r.Node != "p40" {
		t.Errorf("first request alone: node %q (%v), want p40, or the test shows nothing", r.Node, err)
	}
}

// restartController stops the harness's controller and starts a fresh one
// on the same API objects, as a new leader would.
func restartController(h *harness, cfg Config) {
	h.t.Helper()
	h.stop()
	_, ctx := ktesting.NewTestContext(h.t)
	ctx, cancel := context.WithCancel(ctx)
	h.ctx, h.cancel, h.done = ctx, cancel, make(chan struct{})
	cfg.Client, cfg.Recorder = h.client, h.rec
	if cfg.Policy == (allocate.Policy{}) {
		cfg.Policy = allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}
	}
	ctrl, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.ctrl = ctrl
	h.start()
}

// A node the pod was unschedulable on is recorded on the pod and stays
// excluded after a controller restart.
func TestExcludedNodeSurvivesRestart(t *testing.T) {
	// The grace is long enough for the test to stop the controller after
	// the move to b before the pod, still marked unschedulable, is
	// released from b too.
	cfg := Config{Workers: 2, UnschedulableGrace: 3 * time.Second}
	h := newHarnessWith(t, cfg, objs(classes(), gpuNode(t, "a", "v100-sxm2-8-aliyun-sccgn6.txt"), gpuNode(t, "b", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("p", true, "c")
	if first := allocatedNode(h.waitAllocated("c")); first != "a" {
		t.Fatalf("first allocation on %s, want a (binpack ties go by name)", first)
	}
	h.waitUngated("p")
	pod := h.getPod("p")
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/2 nodes are available: 1 Insufficient cpu."}}
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("node a recorded on the pod", func() bool { return h.getPod("p").Annotations[ExcludedNodesAnnotation] == "a" })
	h.eventually("claim reallocated on b", func() bool {
		c := h.getClaim("c")
		return c.Status.Allocation != nil && allocatedNode(c) == "b"
	})
	h.stop()

	// Meanwhile b's allocation is released too (say by kube-scheduler) and
	// the pod is pending again, its condition cleared.
	c := h.getClaim("c")
	c.Status.ReservedFor, c.Status.Allocation = nil, nil
	if _, err := h.client.ResourceV1().ResourceClaims(ns).UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod = h.getPodCtx(context.Background(), "p")
	pod.Status.Conditions = nil
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	restartController(h, cfg)
	if n := allocatedNode(h.waitAllocated("c")); n != "b" {
		t.Errorf("after a restart the claim went to %s, want b: node a is excluded by the pod's annotation", n)
	}
}

func (h *harness) getPodCtx(ctx context.Context, name string) *corev1.Pod {
	h.t.Helper()
	p, err := h.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}
