package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/allocate"
)

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func fitPodSpec(name, node string, requests corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name), Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: requests}}}},
	}
}

func fitNode(name string, alloc corev1.ResourceList) *corev1.Node {
	n := controllertest.Node(name)
	n.Status.Allocatable = alloc
	return n
}

// The demand is kube-scheduler's: the larger of the containers' sum and
// any init container, sidecars on top, overhead added; native resources
// it does not fit are dropped.
func TestPodDemand(t *testing.T) {
	p := fitPodSpec("p", "", rl("cpu", "500m", "memory", "1Gi", "example.com/fpga", "1", "storage", "5Gi"))
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "250m")}})
	p.Spec.InitContainers = []corev1.Container{
		{Name: "init", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "2", "memory", "100Mi")}},
		{Name: "sidecar", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Requests: rl("memory", "512Mi")}},
	}
	p.Spec.Overhead = rl("cpu", "100m")
	got := planner.PodDemand(p)
	want := planner.Demand{
		corev1.ResourceCPU:    2100,                       // init container 2 CPUs beats 750m (+ sidecar 0), plus overhead
		corev1.ResourceMemory: (1024 + 512) * 1024 * 1024, // containers plus the sidecar
		"example.com/fpga":    1,
	}
	if !planner.DemandEqual(got, want) {
		t.Errorf("demand %v, want %v", got, want)
	}
}

func TestFitTrackerResources(t *testing.T) {
	f := planner.NewFitTracker()
	node := fitNode("n", rl("cpu", "4", "memory", "8Gi", "pods", "3", "example.com/fpga", "1"))
	f.Observe(fitPodSpec("a", "n", rl("cpu", "3")))
	f.Observe(fitPodSpec("done", "n", rl("cpu", "4")))
	done := fitPodSpec("done", "n", rl("cpu", "4"))
	done.Status.Phase = corev1.PodSucceeded
	f.Observe(done)
	f.Observe(fitPodSpec("elsewhere", "m", rl("cpu", "4")))
	f.Observe(fitPodSpec("unbound", "", rl("cpu", "4")))

	reason := func(p *corev1.Pod) string {
		return f.Check(p, func(string) map[string]string { return nil }).Reject(node, nil)
	}
	if r := reason(fitPodSpec("x", "", rl("cpu", "1"))); r != "" {
		t.Errorf("1 CPU on a node with 1 of 4 left: %q, want it to fit (the finished, unbound and other nodes' pods do not count)", r)
	}
	if r := reason(fitPodSpec("x", "", rl("cpu", "1500m"))); r != "Insufficient cpu" {
		t.Errorf("1.5 CPUs: %q, want Insufficient cpu", r)
	}
	if r := reason(fitPodSpec("x", "", rl("memory", "9Gi"))); r != "Insufficient memory" {
		t.Errorf("9Gi: %q, want Insufficient memory", r)
	}
	if r := reason(fitPodSpec("x", "", rl("example.com/fpga", "2"))); r != "Insufficient example.com/fpga" {
		t.Errorf("2 FPGAs: %q", r)
	}
	if r := reason(fitPodSpec("x", "", rl("example.com/other", "1"))); r != "Insufficient example.com/other" {
		t.Errorf("an extended resource the node lacks: %q", r)
	}
	if r := f.Check(fitPodSpec("x", "", rl("example.com/other", "1")), func(string) map[string]string { return nil }).Reject(node, func(corev1.ResourceName) bool { return true }); r != "" {
		t.Errorf("an extended resource a DeviceClass serves: %q, want it left to kube-scheduler's DRA plugin", r)
	}

	// An assumption counts like a bound pod until it is dropped.
	f.Assume(fitPodSpec("decided", "", rl("cpu", "1")), "n")
	if r := reason(fitPodSpec("x", "", rl("cpu", "1"))); r != "Insufficient cpu" {
		t.Errorf("after an assumption of 1 CPU: %q, want Insufficient cpu", r)
	}
	f.Observe(fitPodSpec("decided", "", rl("cpu", "1"))) // informer, still unbound
	if r := reason(fitPodSpec("x", "", rl("cpu", "1"))); r != "Insufficient cpu" {
		t.Errorf("the unbound pod's informer update dropped the assumption: %q", r)
	}
	f.Unassume("decided")
	if r := reason(fitPodSpec("x", "", rl("cpu", "1"))); r != "" {
		t.Errorf("after unassume: %q", r)
	}
	// The pod being decided does not count against itself.
	f.Assume(fitPodSpec("x", "", rl("cpu", "1")), "n")
	if r := reason(fitPodSpec("x", "", rl("cpu", "1"))); r != "" {
		t.Errorf("the pod counted against itself: %q", r)
	}
	f.Unassume("x")

	f.Observe(fitPodSpec("b", "n", nil))
	f.Observe(fitPodSpec("c", "n", nil))
	if r := reason(fitPodSpec("x", "", nil)); r != "Too many pods" {
		t.Errorf("4th pod on a 3-pod node: %q, want Too many pods", r)
	}
	f.Forget("c")
	f.Forget("b")
	f.Forget("a")
	if len(f.Nodes) != 1 || f.Nodes["m"] == nil {
		t.Errorf("node sums left after every pod of n is gone: %v", f.Nodes)
	}
}

func TestFitTrackerPodAffinity(t *testing.T) {
	f := planner.NewFitTracker()
	nodes := map[string]*corev1.Node{"n1": controllertest.Node("n1"), "n2": controllertest.Node("n2"), "n3": controllertest.Node("n3")}
	nodes["n1"].Labels["zone"] = "z1"
	nodes["n2"].Labels["zone"] = "z1"
	nodes["n3"].Labels["zone"] = "z2"
	labelsOf := func(n string) map[string]string {
		if node := nodes[n]; node != nil {
			return node.Labels
		}
		return nil
	}
	term := func(key string, app string) corev1.PodAffinityTerm {
		return corev1.PodAffinityTerm{TopologyKey: key, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}
	}
	allowed := func(p *corev1.Pod) string {
		fc := f.Check(p, labelsOf)
		var out []string
		for _, n := range []string{"n1", "n2", "n3"} {
			if fc.Reject(nodes[n], nil) == "" {
				out = append(out, n)
			}
		}
		return strings.Join(out, ",")
	}
	f.Observe(fitPodSpec("db", "n1", nil))

	anti := fitPodSpec("web", "", nil)
	anti.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(corev1.LabelHostname, "db")}}}
	if got := allowed(anti); got != "n2,n3" {
		t.Errorf("anti-affinity to db by hostname: nodes %s, want n2,n3", got)
	}
	anti.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0] = term("zone", "db")
	if got := allowed(anti); got != "n3" {
		t.Errorf("anti-affinity to db by zone: nodes %s, want n3", got)
	}

	with := fitPodSpec("cache", "", nil)
	with.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term("zone", "db")}}}
	if got := allowed(with); got != "n1,n2" {
		t.Errorf("affinity to db by zone: nodes %s, want n1,n2", got)
	}
	// The first pod of a group that selects itself goes anywhere.
	self := fitPodSpec("grp", "", nil)
	self.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(corev1.LabelHostname, "grp")}}}
	if got := allowed(self); got != "n1,n2,n3" {
		t.Errorf("first pod of a self-affine group: nodes %s, want all", got)
	}
	// A term with a namespaceSelector is not evaluated (left to kube-scheduler).
	ns := term(corev1.LabelHostname, "nothing")
	ns.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}
	with.Spec.Affinity.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = []corev1.PodAffinityTerm{ns}
	if got := allowed(with); got != "n1,n2,n3" {
		t.Errorf("namespaceSelector term: nodes %s, want all (not evaluated)", got)
	}

	// An existing pod's anti-affinity keeps matching pods off its node.
	loner := fitPodSpec("loner", "n3", nil)
	loner.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term(corev1.LabelHostname, "web")}}}
	f.Observe(loner)
	plain := fitPodSpec("web", "", nil)
	if got := allowed(plain); got != "n1,n2" {
		t.Errorf("pod selected by loner's anti-affinity: nodes %s, want n1,n2", got)
	}
	if r := f.Check(plain, labelsOf).Reject(nodes["n3"], nil); r != planner.FitExistingAntiAffnity {
		t.Errorf("reason %q", r)
	}
}

func TestRejectionsSummary(t *testing.T) {
	r := &planner.Rejections{}
	for range 5 {
		r.Add("Insufficient cpu")
	}
	for range 3 {
		r.Add("no 4 free GPUs with every pair NVLink")
	}
	r.Add("node(s) were unschedulable")
	r.Add("Insufficient memory")
	want := "0/12 nodes: 5 Insufficient cpu, 3 no 4 free GPUs with every pair NVLink, 1 Insufficient memory, 1 node(s) were unschedulable"
	if got := r.Summary(12); got != want {
		t.Errorf("summary\n %q, want\n %q", got, want)
	}
}

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
		withResources(gpuNode(t, "a100", "dgx-a100.txt"), rl("cpu", "1", "memory", "64Gi", "pods", "110")),
		gpuNode(t, "v100", "v100-sxm2-8-aliyun-sccgn6.txt"))...).start()
	h.claim("small", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h.pod("small", true, "small")
	if n := allocatedNode(h.waitAllocated("small")); n != "a100" {
		t.Fatalf("pod without CPU requests on %s, want a100 (best links)", n)
	}
	h.claim("c", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: ns, UID: uuid.NewUUID()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "2")}}},
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
	p.Spec.Containers[0].Resources.Requests = rl("memory", "2Ti")
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
