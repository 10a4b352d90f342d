package planner

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
)

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
	p := fitPodSpec("p", "", controllertest.ResourceList("cpu", "500m", "memory", "1Gi", "example.com/fpga", "1", "storage", "5Gi"))
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Resources: corev1.ResourceRequirements{Requests: controllertest.ResourceList("cpu", "250m")}})
	p.Spec.InitContainers = []corev1.Container{
		{Name: "init", Resources: corev1.ResourceRequirements{Requests: controllertest.ResourceList("cpu", "2", "memory", "100Mi")}},
		{Name: "sidecar", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Requests: controllertest.ResourceList("memory", "512Mi")}},
	}
	p.Spec.Overhead = controllertest.ResourceList("cpu", "100m")
	got := podDemand(p)
	want := demand{
		corev1.ResourceCPU:    2100,                       // init container 2 CPUs beats 750m (+ sidecar 0), plus overhead
		corev1.ResourceMemory: (1024 + 512) * 1024 * 1024, // containers plus the sidecar
		"example.com/fpga":    1,
	}
	if !demandEqual(got, want) {
		t.Errorf("demand %v, want %v", got, want)
	}
}

func TestFitTrackerResources(t *testing.T) {
	f := NewFitTracker()
	node := fitNode("n", controllertest.ResourceList("cpu", "4", "memory", "8Gi", "pods", "3", "example.com/fpga", "1"))
	f.Observe(fitPodSpec("a", "n", controllertest.ResourceList("cpu", "3")))
	f.Observe(fitPodSpec("done", "n", controllertest.ResourceList("cpu", "4")))
	done := fitPodSpec("done", "n", controllertest.ResourceList("cpu", "4"))
	done.Status.Phase = corev1.PodSucceeded
	f.Observe(done)
	f.Observe(fitPodSpec("elsewhere", "m", controllertest.ResourceList("cpu", "4")))
	f.Observe(fitPodSpec("unbound", "", controllertest.ResourceList("cpu", "4")))

	reason := func(p *corev1.Pod) string {
		return f.check(p, func(string) map[string]string { return nil }).reject(node, nil)
	}
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1"))); r != "" {
		t.Errorf("1 CPU on a node with 1 of 4 left: %q, want it to fit (the finished, unbound and other nodes' pods do not count)", r)
	}
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1500m"))); r != "Insufficient cpu" {
		t.Errorf("1.5 CPUs: %q, want Insufficient cpu", r)
	}
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("memory", "9Gi"))); r != "Insufficient memory" {
		t.Errorf("9Gi: %q, want Insufficient memory", r)
	}
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("example.com/fpga", "2"))); r != "Insufficient example.com/fpga" {
		t.Errorf("2 FPGAs: %q", r)
	}
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("example.com/other", "1"))); r != "Insufficient example.com/other" {
		t.Errorf("an extended resource the node lacks: %q", r)
	}
	if r := f.check(fitPodSpec("x", "", controllertest.ResourceList("example.com/other", "1")), func(string) map[string]string { return nil }).reject(node, func(corev1.ResourceName) bool { return true }); r != "" {
		t.Errorf("an extended resource a DeviceClass serves: %q, want it left to kube-scheduler's DRA plugin", r)
	}

	// An assumption counts like a bound pod until it is dropped.
	f.Assume(fitPodSpec("decided", "", controllertest.ResourceList("cpu", "1")), "n")
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1"))); r != "Insufficient cpu" {
		t.Errorf("after an assumption of 1 CPU: %q, want Insufficient cpu", r)
	}
	f.Observe(fitPodSpec("decided", "", controllertest.ResourceList("cpu", "1"))) // informer, still unbound
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1"))); r != "Insufficient cpu" {
		t.Errorf("the unbound pod's informer update dropped the assumption: %q", r)
	}
	f.Unassume("decided")
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1"))); r != "" {
		t.Errorf("after unassume: %q", r)
	}
	// The pod being decided does not count against itself.
	f.Assume(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1")), "n")
	if r := reason(fitPodSpec("x", "", controllertest.ResourceList("cpu", "1"))); r != "" {
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
	f := NewFitTracker()
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
		fc := f.check(p, labelsOf)
		var out []string
		for _, n := range []string{"n1", "n2", "n3"} {
			if fc.reject(nodes[n], nil) == "" {
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
	if r := f.check(plain, labelsOf).reject(nodes["n3"], nil); r != fitExistingAntiAffnity {
		t.Errorf("reason %q", r)
	}
}

func TestRejectionsSummary(t *testing.T) {
	r := &Rejections{}
	for range 5 {
		r.add("Insufficient cpu")
	}
	for range 3 {
		r.add("no 4 free GPUs with every pair NVLink")
	}
	r.add("node(s) were unschedulable")
	r.add("Insufficient memory")
	want := "0/12 nodes: 5 Insufficient cpu, 3 no 4 free GPUs with every pair NVLink, 1 Insufficient memory, 1 node(s) were unschedulable"
	if got := r.summary(12); got != want {
		t.Errorf("summary\n %q, want\n %q", got, want)
	}
}
