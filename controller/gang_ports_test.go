package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// hostPort8080 is a container port held on the node, as a launcher's or
// an NCCL bootstrap's.
var hostPort8080 = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}

// gangPodPorts creates a gang pod (gangPod) whose container takes ports.
func (h *harness) gangPodPorts(name, gangName string, size, gpus int, extra map[string]string, ports []corev1.ContainerPort) {
	h.t.Helper()
	p := h.newGangPod(name, gangName, size, gpus, extra)
	p.Spec.Containers[0].Ports = ports
	h.createGangPod(p)
}

// boundPortPod creates a pod without claims bound to node, holding ports.
func (h *harness) boundPortPod(name, node string, ports []corev1.ContainerPort) {
	h.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x", Ports: ports}}}}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestGangHostPortOnePodPerNode: a gang of 2 pods × 2 GPUs with hostPort
// 8080 is not packed on one 4-GPU node (kube-scheduler would refuse the
// second pod: the port is taken by the first) but spread one per node.
// Required in one leaf whose one node has room for both by GPUs, it
// waits rather than running in part.
func TestGangHostPortOnePodPerNode(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"), leafNode(t, "c", "l2"))...).start()
	h.gangPodPorts("p0", "spread", 2, 2, nil, hostPort8080)
	h.gangPodPorts("p1", "spread", 2, 2, nil, hostPort8080)
	h.waitUngated("p0")
	h.waitUngated("p1")
	nodes := h.allocatedNodes("p0", "p1")
	if nodes["p0"] == "" || nodes["p0"] == nodes["p1"] {
		t.Fatalf("gang pods with hostPort 8080 on %v, want one per node", nodes)
	}

	// Leaf l2 has one node: a Required gang with the port waits there.
	req := map[string]string{gangs.LabelLevel: "leaf"}
	for _, n := range []string{"a", "b"} {
		h.boundPortPod("holder-"+n, n, hostPort8080)
	}
	h.gangPodPorts("q0", "tight", 2, 2, req, hostPort8080)
	h.gangPodPorts("q1", "tight", 2, 2, req, hostPort8080)
	e := h.waitEventWith(ns+"/q0", report.ReasonGangWaiting, "only 1 fit in one leaf")
	h.settle()
	for _, name := range []string{"q0", "q1"} {
		if c := h.getClaim(name); c.Status.Allocation != nil {
			t.Errorf("claim %s allocated while its gang cannot fit in one leaf (%s)", name, e.Note)
		}
	}
}

// TestHostPortSingletonAvoidsNode: a GPU pod with hostPort 8080 is not
// allocated on the node whose bound pod holds the port, though that node
// is its tightest fit by GPUs.
func TestHostPortSingletonAvoidsNode(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", ""), leafNode(t, "b", ""))...).start()
	h.singletonOn("sa", "a", 2)
	h.boundPortPod("web", "a", hostPort8080)
	h.claim("p", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x", Ports: hostPort8080}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("p")}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}}}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitAllocated("p")
	if got := allocatedNode(h.getClaim("p")); got != "b" {
		t.Errorf("pod with hostPort 8080 allocated on %s, want b (a's bound pod holds the port)", got)
	}
}
