//go:build integration

package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// holdGate is another component's gate, which keeps a pod from
// kube-scheduler after gpulink lifted its own.
const holdGate = "example.com/hold"

// addCPUNode creates an API-only node without GPUs (no ResourceSlice).
func (e *env) addCPUNode(name, cpu string) {
	e.t.Helper()
	node := controllertest.Node(name)
	node.Status.Capacity[corev1.ResourceCPU] = resource.MustParse(cpu)
	node.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
	e.createNode(node)
	e.t.Cleanup(func() { _ = e.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// cpuOnlyPod is a pod without claims asking for one CPU, gated by gpulink
// (as the chart's gate.cpuPods policy gates it) and by the given further
// gates, and held to the test's nodes by a required node affinity.
func (e *env) cpuOnlyPod(name string, nodes []string, gates ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}}}}}}},
		},
	}
	for _, g := range append(gates, driver.SchedulingGate) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
	}
	return p
}

// waitSchedulerSeesCordon returns once kube-scheduler's cache holds the
// node as cordoned. The API server has the cordon as soon as the patch
// returns, but kube-scheduler learns it from its informer later: a pod
// released before then may still be bound to the node (seen once in a
// fresh make test). A probe pod that may run only there and that
// kube-scheduler finds unschedulable shows that it has seen the cordon; a
// probe bound there shows that it had not yet, and is deleted and tried
// again.
func (e *env) waitSchedulerSeesCordon(node string) {
	e.t.Helper()
	for attempt := 0; ; attempt++ {
		name := fmt.Sprintf("cordon-probe-%d", attempt)
		probe := e.cpuOnlyPod(name, []string{node})
		probe.Spec.SchedulingGates = nil
		e.createPod(probe)
		var bound bool
		e.poll("kube-scheduler's verdict on pod "+name, time.Minute, func() bool {
			p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			bound = p.Spec.NodeName != ""
			return bound || slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
			})
		})
		e.deletePod(name)
		if !bound {
			return
		}
		if attempt == 10 {
			e.t.Fatalf("kube-scheduler still binds pods to node %s after it was cordoned (%d probes)", node, attempt+1)
		}
	}
}

// preferred returns the nodes the pod's preferred node terms name by
// metadata.name.
func preferred(p *corev1.Pod) []string {
	var out []string
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
		return nil
	}
	for _, t := range p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		for _, f := range t.Preference.MatchFields {
			if f.Key == "metadata.name" {
				out = append(out, f.Values...)
			}
		}
	}
	return out
}

// A pod without GPU claims, gated, on a cluster of a GPU node with 1,000
// CPUs and a node without GPUs with 8: kube-scheduler's default scoring
// (LeastAllocated) puts it on the GPU node (pod control). The controller
// nominates the node without GPUs and lifts the gate preferring it, and
// kube-scheduler binds it there. A second pod, also steered to the node without GPUs, is held by
// another component's gate while that node is cordoned: neither the
// nomination nor the preference is a requirement, and kube-scheduler binds
// it to the GPU node instead.
func TestCPUOnlyPodsPreferredNode(t *testing.T) {
	e := setup(t, map[string]string{})
	e.configure = func(c *controller.Config) { c.PlaceCPUPods, c.RankByStranding = true, true }
	gpuNode, cpuNode := e.ns+"-gpu", e.ns+"-cpu"
	e.addNode(gpuNode, fixture(t, "v100-sxm2-8-aliyun-sccgn6.txt"))
	e.addCPUNode(cpuNode, "8")
	nodes := []string{gpuNode, cpuNode}
	r := e.startController(2)
	defer r.stop()

	// Without gpulink's gate kube-scheduler spreads: the GPU node.
	control := e.cpuOnlyPod("control", nodes)
	control.Spec.SchedulingGates = nil
	if p := e.startBound(control, time.Minute); p.Spec.NodeName != gpuNode {
		t.Fatalf("pod control (not gated) bound to %s, want %s: the test needs kube-scheduler to prefer the GPU node on its own", p.Spec.NodeName, gpuNode)
	}

	// Placed and bound where the controller chose.
	e.createPod(e.cpuOnlyPod("steered", nodes))
	p := e.waitBound("steered", time.Minute)
	if got := preferred(p); !slices.Equal(got, []string{cpuNode}) {
		t.Fatalf("pod steered: preferred nodes %v, want [%s]", got, cpuNode)
	}
	if p.Spec.NodeName != cpuNode {
		t.Errorf("pod steered bound to %s, want the preferred %s", p.Spec.NodeName, cpuNode)
	}
	// The event is recorded asynchronously, often after the pod is bound.
	e.waitEvent("steered", "preferring node "+cpuNode, 30*time.Second)

	// The preferred node turns unfit before kube-scheduler sees the pod.
	e.createPod(e.cpuOnlyPod("fallback", nodes, holdGate))
	e.poll("gpulink's gate lifted from pod fallback", time.Minute, func() bool {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "fallback", metav1.GetOptions{})
		return err == nil && !slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == driver.SchedulingGate })
	})
	cordon := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := e.client.CoreV1().Nodes().Patch(e.ctx, cpuNode, types.MergePatchType, cordon, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitSchedulerSeesCordon(cpuNode)
	held, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "fallback", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := preferred(held); !slices.Equal(got, []string{cpuNode}) {
		t.Fatalf("pod fallback: preferred nodes %v, want [%s]", got, cpuNode)
	}
	if held.Status.NominatedNodeName != cpuNode {
		t.Fatalf("pod fallback: nominated node %q, want %s", held.Status.NominatedNodeName, cpuNode)
	}
	release, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/spec/schedulingGates/0/name", "value": holdGate},
		{"op": "remove", "path": "/spec/schedulingGates/0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods(e.ns).Patch(e.ctx, "fallback", types.JSONPatchType, release, metav1.PatchOptions{}); err != nil {
		t.Fatalf("lifting gate %s: %v", holdGate, err)
	}
	p = e.waitBound("fallback", time.Minute)
	if p.Spec.NodeName != gpuNode {
		t.Errorf("pod fallback bound to %s, want %s (its preferred node %s is cordoned)", p.Spec.NodeName, gpuNode, cpuNode)
	}
	t.Logf("steered pod on %s, fallback pod on %s", cpuNode, p.Spec.NodeName)
}
