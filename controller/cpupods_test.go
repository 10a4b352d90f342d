package controller

import (
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// cpuPodSpec describes a pod for the CPU-pod tests.
type cpuPodSpec struct {
	name string
	cpu  string
	// claim, when set, is a claim the pod uses (a GPU pod).
	claim string
	// node, when set, is the pod's nodeSelector on the hostname label.
	node string
	// affinity is the pod's own affinity.
	affinity *corev1.Affinity
	gated    bool
}

func (h *harness) cpuPod(s cpuPodSpec) {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "x", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(s.cpu)}}}},
			Affinity: s.affinity,
		},
	}
	if s.claim != "" {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: s.claim, ResourceClaimName: ptr.To(s.claim)}}
	}
	if s.node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: s.node}
	}
	if s.gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
	}
	if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// preferredNodes lists the nodes the pod's preferred node affinity names
// by metadata.name with the weight gpulink writes.
func preferredNodes(p *corev1.Pod) []string {
	var out []string
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
		return nil
	}
	for _, term := range p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		for _, f := range term.Preference.MatchFields {
			if term.Weight == preferredNodeWeight && f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				out = append(out, f.Values[0])
			}
		}
	}
	return out
}

// cpuNode is a node without GPUs (no ResourceSlice).
func cpuNode(name, cpu string) *corev1.Node {
	n := controllertest.Node(name)
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
	return n
}

// withCPU sets the allocatable CPU of the named nodes among objs.
func withCPU(objs []runtime.Object, cpu map[string]string) []runtime.Object {
	for _, o := range objs {
		if n, ok := o.(*corev1.Node); ok && cpu[n.Name] != "" {
			n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu[n.Name])
		}
	}
	return objs
}

// A gated pod without claims is nominated for the node ChooseHost picks
// and ungated with a preferred term for it: the node without GPUs over the GPU node (although the
// GPU node has more CPU left, which kube-scheduler's default scoring
// prefers), unless the pod's node selector rules the node without GPUs
// out. Without PlaceCPUPods the gate goes without a preference.
func TestCPUPodPreferredNode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		place bool
		node  string
		want  []string
	}{
		{name: "node without GPUs first", place: true, want: []string{"cpu"}},
		{name: "only the GPU node matches the selector", place: true, node: "gpu", want: []string{"gpu"}},
		{name: "off", place: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: tc.place},
				objs(classes(), gpuNode(t, "gpu", "pcie-4.txt"), []runtime.Object{cpuNode("cpu", "4")})...).start()
			h.cpuPod(cpuPodSpec{name: "p", cpu: "1", node: tc.node, gated: true})
			h.waitUngated("p")
			got := preferredNodes(h.getPod("p"))
			if len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
				t.Fatalf("preferred nodes %v, want %v (affinity %+v)", got, tc.want, h.getPod("p").Spec.Affinity)
			}
			nominated := h.getPod("p").Status.NominatedNodeName
			if (len(tc.want) == 1 && nominated != tc.want[0]) || (len(tc.want) == 0 && nominated != "") {
				t.Errorf("nominated node %q, want %v", nominated, tc.want)
			}
			ev := h.waitEvent(ns+"/p", report.ReasonGateRemoved)
			if tc.place && !contains(ev.Note, "preferring node "+tc.want[0]) {
				t.Errorf("event %q does not name the preferred node %s", ev.Note, tc.want[0])
			}
		})
	}
}

// With ranking by stranding, the recent GPU pods (a GPU and 2 CPUs) say
// where CPU is worth keeping: node b (4 GPUs, 8 CPUs, one pod of that
// shape on it) would keep 1 CPU after a 5-CPU pod, too little for that
// shape, stranding its 3 free GPUs; node a (4 GPUs, 64 CPUs) strands
// none. Ranked by GPUs alone the pod packs onto b, the node with less
// unallocated GPU.
func TestCPUPodAvoidsStrandingGPU(t *testing.T) {
	for _, tc := range []struct {
		stranding bool
		want      string
	}{{true, "a"}, {false, "b"}} {
		h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: true, RankByStranding: tc.stranding},
			withCPU(objs(classes(), gpuNode(t, "a", "pcie-4.txt"), gpuNode(t, "b", "pcie-4.txt")), map[string]string{"a": "64", "b": "8"})...).start()
		h.claim("g", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
		h.cpuPod(cpuPodSpec{name: "gpu-pod", cpu: "2", claim: "g", node: "b", gated: true})
		held, ok, err := gpuview.ClaimDevices(h.waitAllocated("g"))
		if err != nil || !ok || held.Node != "b" {
			t.Fatalf("GPU pod's claim: %+v %v %v, want it on b", held, ok, err)
		}
		h.cpuPod(cpuPodSpec{name: "cpu-pod", cpu: "5", gated: true})
		h.waitUngated("cpu-pod")
		if got := preferredNodes(h.getPod("cpu-pod")); len(got) != 1 || got[0] != tc.want {
			t.Errorf("rank by stranding %v: preferred nodes %v, want [%s]", tc.stranding, got, tc.want)
		}
		h.stop()
	}
}

// The pod's own node affinity stays: gpulink's term is appended to its
// preferred terms, and its required terms are untouched.
func TestCPUPodKeepsOwnAffinity(t *testing.T) {
	own := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"cpu", "gpu"}}}}}},
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 5, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpExists}}}}},
	}}
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: true},
		objs(classes(), gpuNode(t, "gpu", "pcie-4.txt"), []runtime.Object{cpuNode("cpu", "4")})...).start()
	h.cpuPod(cpuPodSpec{name: "p", cpu: "1", affinity: own, gated: true})
	h.waitUngated("p")
	na := h.getPod("p").Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 1 {
		t.Errorf("required terms changed: %+v", na.RequiredDuringSchedulingIgnoredDuringExecution)
	}
	pref := na.PreferredDuringSchedulingIgnoredDuringExecution
	if len(pref) != 2 || pref[0].Weight != 5 || len(preferredNodes(h.getPod("p"))) != 1 {
		t.Errorf("preferred terms %+v, want the pod's own then gpulink's", pref)
	}
}

// CPU-only pods decided one after another count on the node chosen for
// them before they are bound: a node without GPUs of 2 CPUs takes two
// 1-CPU pods, the third goes to the GPU node.
func TestCPUPodsCountBeforeBinding(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: true},
		objs(classes(), gpuNode(t, "gpu", "pcie-4.txt"), []runtime.Object{cpuNode("cpu", "2")})...).start()
	var got []string
	for _, name := range []string{"p0", "p1", "p2"} {
		h.cpuPod(cpuPodSpec{name: name, cpu: "1", gated: true})
		h.waitUngated(name)
		got = append(got, preferredNodes(h.getPod(name))...)
	}
	if want := []string{"cpu", "cpu", "gpu"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("preferred nodes %v, want %v", got, want)
	}
}

// Placing a pod costs two writes: the nomination and the gate removal
// with the preferred term, the latter tested against the resourceVersion
// the nomination returned (not the cache's, which would fail the patch's
// test and cost a read and a third write).
func TestCPUPodWrites(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: true},
		objs(classes(), gpuNode(t, "gpu", "pcie-4.txt"), []runtime.Object{cpuNode("cpu", "4")})...).start()
	h.client.PrependReactor("patch", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		pa := action.(clienttesting.PatchAction)
		if pa.GetSubresource() == "status" {
			// As the API server: a write moves the resourceVersion on.
			obj, err := h.client.Tracker().Get(pa.GetResource(), pa.GetNamespace(), pa.GetName())
			if err == nil {
				if m, err := meta.Accessor(obj); err == nil {
					m.SetResourceVersion(m.GetResourceVersion() + "1")
					_ = h.client.Tracker().Update(pa.GetResource(), obj, pa.GetNamespace())
				}
			}
		}
		return false, nil, nil
	})
	h.client.ClearActions()
	h.cpuPod(cpuPodSpec{name: "p", cpu: "1", gated: true})
	// Read from the tracker: the test's own reads are not the controller's.
	podsGVR := corev1.SchemeGroupVersion.WithResource("pods")
	h.eventually("pod p ungated", func() bool {
		obj, err := h.client.Tracker().Get(podsGVR, ns, "p")
		return err == nil && gateIndex(obj.(*corev1.Pod)) < 0
	})
	counts := map[string]int{}
	for _, a := range h.client.Actions() {
		if a.GetResource().Resource == "pods" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			counts[a.GetVerb()+"/"+a.GetSubresource()]++
		}
	}
	if want := map[string]int{"create/": 1, "patch/status": 1, "patch/": 1}; !maps.Equal(counts, want) {
		t.Errorf("pod requests %v, want %v", counts, want)
	}
}

// A placed pod counts on its node until kube-scheduler finds it
// unschedulable: then it counts nowhere until bound.
func TestCPUPodUnschedulableCountsNowhere(t *testing.T) {
	h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: true},
		objs(classes(), gpuNode(t, "gpu", "pcie-4.txt"), []runtime.Object{cpuNode("cpu", "4")})...).start()
	left := func() int64 {
		if l := h.ctrl.filter.HostLeft("cpu"); l != nil {
			return l.CPUMilli
		}
		return -1
	}
	h.cpuPod(cpuPodSpec{name: "p", cpu: "1", gated: true})
	h.waitUngated("p")
	h.eventually("the pod counted on node cpu", func() bool { return left() == 3000 })
	p := h.getPod("p")
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable})
	if _, err := h.client.CoreV1().Pods(ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the unschedulable pod no longer counted on node cpu", func() bool { return left() == 4000 })
}

// A pod without claims among equal nodes goes by the hierarchy, as GPU
// pods do (TestSinglesFillOneLeafWhateverTheNames): node b in leaf l1
// before node a in leaf l2, and among nodes without GPUs (which come
// before an idle GPU node), d in l1 before c in l2.
func TestCPUPodTiesFollowHierarchy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []runtime.Object
		want  string
	}{
		{name: "GPU nodes", nodes: objs(leafNode(t, "a", "l2"), leafNode(t, "b", "l1")), want: "b"},
		{name: "nodes without GPUs", nodes: objs(gpuNode(t, "gpu", "pcie-4.txt"), []runtime.Object{leafCPUNode("c", "l2"), leafCPUNode("d", "l1")}), want: "d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, PlaceCPUPods: true}, objs(classes(), tc.nodes)...).start()
			h.cpuPod(cpuPodSpec{name: "p", cpu: "1", gated: true})
			h.waitUngated("p")
			if got := preferredNodes(h.getPod("p")); len(got) != 1 || got[0] != tc.want {
				t.Errorf("preferred nodes %v, want [%s] (first leaf by the hierarchy)", got, tc.want)
			}
		})
	}
}

// leafCPUNode is a node without GPUs under a leaf switch.
func leafCPUNode(name, leaf string) *corev1.Node {
	n := cpuNode(name, "4")
	n.Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: leaf}
	return n
}
