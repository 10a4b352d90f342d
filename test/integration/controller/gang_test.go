//go:build integration

package controller_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver/gang"
)

// gangCluster creates API-only 4-GPU nodes (pcie-4.txt) labelled into two
// leaves, l1 (a1-a3) and l2 (b1-b4), with b3 and b4 in one NVLink clique,
// and a template of one 4-GPU claim: one gang pod per node.
func gangCluster(t *testing.T) *env {
	e := setup(t, nil)
	topo := fixture(t, "pcie-4.txt")
	add := func(name, leaf, clique string) {
		n := controllertest.Node(name)
		n.Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: leaf, gang.LabelSpine: "s1"}
		if clique != "" {
			n.Labels[gang.LabelClique] = clique
		}
		e.addNodeWith(name, topo, n)
	}
	// Node names carry the namespace: tests share the cluster.
	for _, n := range []struct{ name, leaf, clique string }{
		{"a1", "l1", ""}, {"a2", "l1", ""}, {"a3", "l1", ""},
		{"b1", "l2", ""}, {"b2", "l2", ""}, {"b3", "l2", "cq"}, {"b4", "l2", "cq"},
	} {
		clique := n.clique
		if clique != "" {
			clique = e.ns + "-" + clique
		}
		add(e.ns+"-"+n.name, e.ns+"-"+n.leaf, clique)
	}
	e.template("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 4)}})
	return e
}

// node is the name of one of gangCluster's nodes.
func (e *env) node(short string) string { return e.ns + "-" + short }

// leafOf returns the short leaf name ("l1") of a node.
func (e *env) leafOf(t *testing.T, node string) string {
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(n.Labels[gang.LabelLeaf], e.ns+"-")
}

// gangPods creates size pods of gang name, each with a 4-GPU claim: through
// a PodGroup (gang minCount size; topology key when level is a node label
// key and required) where the cluster serves the Workload API and
// podGroup is set, else through gpulink's labels. labels are added to the
// pods (a gang level or policy).
func (e *env) gangPods(name string, size int, podGroup bool, level string, required bool) []string {
	e.t.Helper()
	return e.gangPodsOf(gangOf{Name: name, Size: size, PodGroup: podGroup, Level: level, Required: required})
}

// gangOf is a gang gangPodsOf creates.
type gangOf struct {
	Name string
	Size int
	// PodGroup makes it a PodGroup's gang where the cluster serves the
	// Workload API, else a gang of gpulink's labels.
	PodGroup bool
	// Level is a level name or node label key (none: ""), Required or
	// Preferred.
	Level    string
	Required bool
	// Templates are each pod's claims' templates (default: "four").
	Templates []string
	// Labels are added to each pod (gang-rails, say).
	Labels map[string]string
	// Ports are each pod's container's ports (a hostPort, say).
	Ports []corev1.ContainerPort
	// Edit, when set, changes pod i before it is created.
	Edit func(i int, p *corev1.Pod)
	// First and Count create pods First to First+Count-1 (a
	// replacement, say); Count 0: all Size pods from First. The PodGroup
	// is created only with the pods from First 0.
	First, Count int
}

// gangPodsOf creates the gang's pods and returns their names.
func (e *env) gangPodsOf(g gangOf) []string {
	e.t.Helper()
	usePG := g.PodGroup && cluster.WorkloadAPI()
	if usePG && g.First == 0 {
		pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: e.ns},
			Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(g.Size)}}}}
		if g.Level != "" && g.Required {
			pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: g.Level}}}
		}
		if _, err := e.client.SchedulingV1beta1().PodGroups(e.ns).Create(e.ctx, pg, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
	templates := g.Templates
	if len(templates) == 0 {
		templates = []string{"four"}
	}
	var names []string
	count := g.Count
	if count == 0 {
		count = g.Size
	}
	for i := g.First; i < g.First+count; i++ {
		p := e.newPod(fmt.Sprintf("%s-%d", g.Name, i), true, templates...)
		p.Labels = map[string]string{}
		p.Spec.Containers[0].Ports = g.Ports
		for k, v := range g.Labels {
			p.Labels[k] = v
		}
		if usePG {
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(g.Name)}
		} else {
			p.Labels[gangs.LabelGang] = g.Name
			p.Labels[gangs.LabelSize] = strconv.Itoa(g.Size)
		}
		// A PodGroup's topology key says a Required level itself.
		levelOnPods := !usePG || !g.Required
		if g.Level != "" && levelOnPods {
			// A node label key is no valid label value ('/'): it goes
			// in an annotation, as docs/gangs.md says.
			p.Annotations = map[string]string{gangs.LabelLevel: g.Level}
			if !g.Required {
				p.Labels[gangs.LabelPolicy] = string(gangs.Preferred)
			}
		}
		if g.Edit != nil {
			g.Edit(i, p)
		}
		e.createPod(p)
		names = append(names, p.Name)
	}
	return names
}

// blocker runs a 4-GPU pod bound to the node.
func (e *env) blocker(name, node string) {
	e.t.Helper()
	p := e.newPod(name, true, "four")
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	e.startBound(p, time.Minute)
}

// allocatedCount counts the pods whose claims are allocated.
func (e *env) allocatedCount(pods []string) int {
	n := 0
	for _, name := range pods {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		for _, c := range e.claimsOf(p) {
			if c.Status.Allocation != nil {
				n++
			}
		}
	}
	return n
}

// waitEvent waits for an event on the pod whose reason and note contain sub.
func (e *env) waitEvent(pod, sub string, timeout time.Duration) string {
	e.t.Helper()
	var found string
	e.poll(fmt.Sprintf("event %q on %s", sub, pod), timeout, func() bool {
		for _, ev := range e.events(pod, "") {
			if strings.Contains(ev, sub) {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// boundNodes waits until every pod is bound and returns their nodes.
func (e *env) boundNodes(pods []string, timeout time.Duration) []string {
	e.t.Helper()
	var nodes []string
	for _, p := range pods {
		nodes = append(nodes, e.waitBound(p, timeout).Spec.NodeName)
	}
	return nodes
}

// TestGangOneLeaf: a 4-pod gang (a PodGroup with a leaf topology key where
// the Workload API is served, gpulink's labels otherwise) waits, holding
// nothing, while no leaf has 4 free nodes, with the message; a
// Preferred gang meanwhile spans two leaves with a Warning; once a leaf
// frees up the Required gang runs there, bound by kube-scheduler.
func TestGangOneLeaf(t *testing.T) {
	e := gangCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	e.blocker("block-a1", e.node("a1"))
	e.blocker("block-b1", e.node("b1"))

	req := e.gangPods("train-a", 4, true, gang.LabelLeaf, true)
	ev := e.waitEvent(req[0], "only 3 fit in one leaf", time.Minute)
	if !strings.Contains(ev, "2 leaves would fit under Preferred") {
		t.Errorf("waiting event %q, want it to say 2 leaves would fit under Preferred", ev)
	}
	t.Logf("Required gang waits: %s", ev)
	if n := e.allocatedCount(req); n != 0 {
		t.Fatalf("%d claims of the waiting gang allocated: a gang holds nothing while it waits", n)
	}

	// Preferred: 2 free nodes in l1 and 3 in l2; it takes 4 across both.
	pref := e.gangPods("train-p", 4, false, gang.LabelLeaf, false)
	nodes := e.boundNodes(pref, 2*time.Minute)
	leaves := map[string]int{}
	for _, n := range nodes {
		leaves[e.leafOf(t, n)]++
	}
	if len(leaves) != 2 {
		t.Errorf("Preferred gang on %v (leaves %v), want two leaves", nodes, leaves)
	}
	ev = e.waitEvent(pref[0], "GangLevelRelaxed", 30*time.Second)
	t.Logf("Preferred gang spans leaves %v: %s", leaves, ev)
	for _, p := range pref {
		e.deletePod(p)
	}
	e.deletePod("block-b1")
	nodes = e.boundNodes(req, 2*time.Minute)
	for _, n := range nodes {
		if l := e.leafOf(t, n); l != "l2" {
			t.Errorf("Required gang pod on %s (leaf %s), want every pod in leaf l2: %v", n, l, nodes)
		}
	}
	e.waitEvent(req[0], "GangPlaced", 30*time.Second)
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestGangsNoDeadlock: two 4-pod gangs on 4 free nodes, their pods created
// interleaved. Placed pod by pod each could take half of the nodes and both
// would wait forever; here one runs whole while the other waits holding
// nothing, then the other runs when the first ends.
func TestGangsNoDeadlock(t *testing.T) {
	e := gangCluster(t)
	ctrl := e.startController(4)
	defer ctrl.stop()
	// l1 is taken: only b1-b4 are free, room for one gang.
	for _, n := range []string{"a1", "a2", "a3"} {
		e.blocker("block-"+n, e.node(n))
	}
	var a, b []string
	for i := range 4 {
		for _, g := range []struct {
			name  string
			names *[]string
		}{{"gang-a", &a}, {"gang-b", &b}} {
			p := e.newPod(fmt.Sprintf("%s-%d", g.name, i), true, "four")
			p.Labels = map[string]string{gangs.LabelGang: g.name, gangs.LabelSize: "4"}
			e.createPod(p)
			*g.names = append(*g.names, p.Name)
		}
	}
	var first, second []string
	e.poll("one gang bound", 2*time.Minute, func() bool {
		for _, g := range [][]string{a, b} {
			all := true
			for _, p := range g {
				pod, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, p, metav1.GetOptions{})
				all = all && err == nil && pod.Spec.NodeName != ""
			}
			if all {
				first = g
				return true
			}
		}
		return false
	})
	second = b
	if slices.Equal(first, b) {
		second = a
	}
	e.waitEvent(second[0], "GangWaiting", time.Minute)
	if n := e.allocatedCount(second); n != 0 {
		t.Fatalf("%d claims of the waiting gang allocated while the other runs", n)
	}
	for _, p := range first {
		e.deletePod(p)
	}
	e.boundNodes(second, 2*time.Minute)
	t.Logf("gang %s ran, then gang %s", first[0], second[0])
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// killTransport stands for the controller process dying in the middle of
// a gang decision: after killAfter claim status writes it cancels the
// controller and fails every request from then on, so nothing of the
// dead controller's rollback reaches the API server.
type killTransport struct {
	next      http.RoundTripper
	killAfter int32
	writes    atomic.Int32
	dead      atomic.Bool
	kill      func()
}

func (k *killTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if k.dead.Load() {
		return nil, errors.New("killed: the controller process is gone")
	}
	if req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/resourceclaims/") && strings.HasSuffix(req.URL.Path, "/status") {
		if k.writes.Add(1) > k.killAfter {
			k.dead.Store(true)
			k.kill()
			return nil, errors.New("killed: the controller process is gone")
		}
	}
	return k.next.RoundTrip(req)
}

// TestGangControllerKilledMidDecision: the controller dies after writing
// 2 of a 4-pod gang's claims. Nothing is ungated or bound; the next
// controller releases the 2 written claims (GangRolledBack) and then
// places the whole gang in one leaf.
func TestGangControllerKilledMidDecision(t *testing.T) {
	e := gangCluster(t)
	first := e.startController(2)
	for _, n := range []string{"a1", "a2", "a3"} {
		e.blocker("block-"+n, e.node(n))
	}
	first.stop()
	kt := &killTransport{killAfter: 2}
	ctrl := e.startControllerWith(2, func(next http.RoundTripper) http.RoundTripper {
		kt.next = next
		return kt
	})
	kt.kill = ctrl.cancel
	pods := e.gangPods("train-k", 4, true, gang.LabelLeaf, true)
	e.poll("controller killed", 2*time.Minute, kt.dead.Load)
	<-ctrl.done
	if n := e.allocatedCount(pods); n != 2 {
		t.Fatalf("%d claims allocated after the kill, want the 2 written before it", n)
	}
	for _, name := range pods {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.SchedulingGates) == 0 || p.Spec.NodeName != "" {
			t.Fatalf("pod %s ungated or bound (node %q) by a half-written gang decision", name, p.Spec.NodeName)
		}
	}
	next := e.startController(2)
	defer next.stop()
	e.waitEvent(pods[0], "GangRolledBack", time.Minute)
	nodes := e.boundNodes(pods, 2*time.Minute)
	for _, n := range nodes {
		if l := e.leafOf(t, n); l != "l2" {
			t.Errorf("gang pod on %s (leaf %s) after recovery, want leaf l2: %v", n, l, nodes)
		}
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestPodGroupLevelClaim: a PodGroup-level ResourceClaim (PodGroup
// spec.resourceClaims, DRAWorkloadResourceClaims) of gpulink devices,
// created by the real resourceclaim controller for the PodGroup, is
// refused with a clear event and its pod stays gated.
func TestPodGroupLevelClaim(t *testing.T) {
	if !cluster.WorkloadAPI() {
		t.Skip("the cluster does not serve the Workload API (GPULINK_WORKLOAD_GATES=off)")
	}
	e := gangCluster(t)
	ctrl := e.startController(2)
	defer ctrl.stop()
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: e.ns},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 1}},
			ResourceClaims:   []schedulingv1beta1.PodGroupResourceClaim{{Name: "c0", ResourceClaimTemplateName: ptr.To("four")}},
		}}
	if _, err := e.client.SchedulingV1beta1().PodGroups(e.ns).Create(e.ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// newPod names its claim c0 from template four: the PodGroup's claim.
	p := e.newPod("member", true, "four")
	p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("shared")}
	e.createPod(p)
	ev := e.waitEvent("member", "PodGroup-level ResourceClaim", time.Minute)
	t.Logf("event: %s", ev)
	got, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "member", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.SchedulingGates) == 0 || got.Spec.NodeName != "" {
		t.Errorf("pod with a PodGroup-level gpulink claim ungated or bound (node %q)", got.Spec.NodeName)
	}
}
