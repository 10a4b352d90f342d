//go:build integration

package controller_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestGangHostPortOnePodPerNode: a gang of 2 pods × 2 GPUs with hostPort
// 8080 (a PodGroup where the Workload API is served, labels otherwise) on
// 4-GPU nodes runs one pod per node, both bound by kube-scheduler: packed
// on one node by their GPUs, the second pod would be refused by
// kube-scheduler's NodePorts ("didn't have free ports"), and the gang
// would run in part or, as a PodGroup, not at all.
func TestGangHostPortOnePodPerNode(t *testing.T) {
	e := gangCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	e.template("two", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	pods := e.gangPodsOf(gangOf{Name: "ported", Size: 2, PodGroup: true, Level: gang.LabelLeaf, Required: true, Templates: []string{"two"},
		Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}})
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range pods {
				t.Logf("events of %s: %v", p, e.events(p, ""))
			}
		}
	})
	nodes := e.boundNodes(pods, time.Minute)
	if nodes[0] == nodes[1] {
		t.Fatalf("gang pods with hostPort 8080 bound on %v, want one per node", nodes)
	}
	if l0, l1 := e.leafOf(t, nodes[0]), e.leafOf(t, nodes[1]); l0 != l1 {
		t.Errorf("gang Required in one leaf on %v (leaves %s, %s)", nodes, l0, l1)
	}
}
