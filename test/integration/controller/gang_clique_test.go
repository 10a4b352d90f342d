//go:build integration

package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// NVLink cliques and ComputeDomains on the local cluster, with nodes that
// carry no nvidia.com/gpu.clique label: their clique is what their GPUs
// publish (gpu.gpulink.dev/cliqueID, "<cluster UUID>.<clique ID>", as the
// kubelet plugin formats NVML's fabric info), as on a GB200 cluster
// without GPU Feature Discovery.

// cliques is a test's two NVLink cliques X and Y of one NVLink cluster,
// in the kubelet plugin's cliqueID format. The cluster UUID is the test's
// own: domains are cluster-wide and tests share the cluster.
type cliques struct{ x, y string }

// cliqueCluster creates API-only 4-GPU nodes (pcie-4.txt) in leaf l1
// whose GPUs publish their clique and that have no clique label: x1-xN
// in clique X and y1-yM in clique Y (short names; e.node gives the
// node's), and the 4-GPU template "four": one gang pod per node.
func cliqueCluster(t *testing.T, inX, inY int) (*env, cliques) {
	e := setup(t, nil)
	fabric := string(uuid.NewUUID())
	cq := cliques{x: fabric + ".1", y: fabric + ".2"}
	for i := range inX {
		e.cliqueNode(fmt.Sprintf("x%d", i+1), cq.x, "")
	}
	for i := range inY {
		e.cliqueNode(fmt.Sprintf("y%d", i+1), cq.y, "")
	}
	e.template("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 4)}})
	return e, cq
}

// cliqueNode creates an API-only 4-GPU node (pcie-4.txt) in leaf l1 whose
// GPUs publish the clique published and whose nvidia.com/gpu.clique label
// is label (none where "").
func (e *env) cliqueNode(short, published, label string) {
	e.t.Helper()
	topo := fixture(e.t, "pcie-4.txt")
	for i := range topo.GPUs {
		topo.GPUs[i].Clique = published
	}
	name := e.node(short)
	n := controllertest.Node(name)
	n.Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: e.ns + "-l1", gang.LabelSpine: "s1"}
	if label != "" {
		n.Labels[gang.LabelClique] = label
	}
	e.addNodeWith(name, topo, n)
}

// cliqueOf is a node's clique: its label, else what its GPUs publish
// (read from its slice).
func (e *env) cliqueOf(node string) string {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if v := n.Labels[gang.LabelClique]; v != "" {
		return v
	}
	s, err := e.client.ResourceV1().ResourceSlices().Get(e.ctx, node+"-"+driver.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range s.Spec.Devices {
		if a, ok := d.Attributes[driver.AttrCliqueID]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return ""
}

// inOneClique fails the test unless every node is in clique want.
func (e *env) inOneClique(t *testing.T, what string, nodes []string, want string) {
	t.Helper()
	for _, n := range nodes {
		if got := e.cliqueOf(n); got != want {
			t.Errorf("%s: pod on %s (clique %q), want every pod in clique %s: %v", what, n, got, want, nodes)
		}
	}
}

// allocatedOnNodes fails the test unless every claim of pods[i] is
// allocated on nodes[i], the node it was bound to, and returns each
// claim's first result, pod by pod.
func (e *env) allocatedOnNodes(t *testing.T, pods, nodes []string) [][]resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	out := make([][]resourceapi.DeviceRequestAllocationResult, len(pods))
	for i, name := range pods {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range e.claimsOf(p) {
			if c.Status.Allocation == nil {
				t.Errorf("pod %s bound with claim %s unallocated", name, c.Name)
				continue
			}
			r := c.Status.Allocation.Devices.Results
			if len(r) == 0 || r[0].Pool != nodes[i] {
				t.Errorf("claim %s of pod %s on %s: results %+v", c.Name, name, nodes[i], r)
				continue
			}
			out[i] = append(out[i], r[0])
		}
	}
	return out
}

// TestGangCliqueFromAttribute: on nodes without the clique label, a claim
// selecting on the published cliqueID by CEL gets a GPU of that clique;
// a gang Required at the clique level (gpulink's labels) waits, holding
// nothing, while no clique has room for it although the two together
// would, with the message; once a clique has room it runs there,
// bound by kube-scheduler, and its GangPlaced event names the clique.
// x3's GPUs publish nothing; its label puts it in clique X with x1 and x2,
// whose GPUs publish X.
func TestGangCliqueFromAttribute(t *testing.T) {
	e, cq := cliqueCluster(t, 2, 2)
	e.cliqueNode("x3", "", cq.x)
	ctrl := e.startController(4)
	defer ctrl.stop()

	// A claim of one GPU of clique Y, selected by the published attribute.
	sel := controllertest.WholeRequest("gpu", 1)
	sel.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf("device.attributes[%q].%s == %q", driver.Name, driver.AttrCliqueID, cq.y)}}}
	e.template("one-in-y", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{sel}})
	p := e.startBound(e.newPod("in-y", true, "one-in-y"), time.Minute)
	if got := e.cliqueOf(p.Spec.NodeName); got != cq.y {
		t.Fatalf("pod selecting clique %s bound to %s (clique %q)", cq.y, p.Spec.NodeName, got)
	}
	if n := nodeOf(e.claimsOf(p)[0]); n != p.Spec.NodeName {
		t.Errorf("claim allocated on %s, pod bound to %s", n, p.Spec.NodeName)
	}

	// X keeps 2 free nodes (x1 taken), Y 1 (in-y holds a GPU of one).
	e.blocker("block-x1", e.node("x1"))
	nvl := e.gangPodsOf(gangOf{Name: "nvl", Size: 3, Level: "clique", Required: true})
	ev := e.waitEvent(nvl[0], "gang nvl: 3 pods × 4 GPUs: only 2 fit in one clique", time.Minute)
	if !strings.Contains(ev, "GangWaiting") || !strings.Contains(ev, "2 cliques would fit under Preferred") {
		t.Errorf("waiting event %q, want a GangWaiting saying 2 cliques would fit under Preferred", ev)
	}
	t.Logf("Required clique gang waits: %s", ev)
	if n := e.allocatedCount(nvl); n != 0 {
		t.Fatalf("%d claims of the waiting gang allocated: a gang holds nothing while it waits", n)
	}

	e.deletePod("block-x1")
	nodes := e.boundNodes(nvl, 2*time.Minute)
	e.inOneClique(t, "Required clique gang", nodes, cq.x)
	if ev := e.waitEvent(nvl[0], "GangPlaced", 30*time.Second); !strings.Contains(ev, "clique "+cq.x) {
		t.Errorf("placed event %q, want it to name clique %s", ev, cq.x)
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// publishComputeDomains publishes on each node the slice of NVIDIA's
// compute-domain kubelet plugin (one IMEX channel and the daemon device)
// and creates its DeviceClasses, and a template "channel" of the claim a
// ComputeDomain gives its pods; the slices are deleted when the test ends.
func (e *env) publishComputeDomains(nodes ...string) {
	e.t.Helper()
	for _, c := range controllertest.ComputeDomainClasses() {
		if _, err := e.client.ResourceV1().DeviceClasses().Create(e.ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			e.t.Fatal(err)
		}
	}
	for _, n := range nodes {
		s := controllertest.ComputeDomainSlice(n, 1)
		if _, err := e.client.ResourceV1().ResourceSlices().Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() {
			_ = e.client.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
	e.template("channel", controllertest.ChannelClaim(string(uuid.NewUUID())))
}

// TestGangComputeDomain: a gang whose pods each claim 4 GPUs and a
// ComputeDomain channel (the claim NVIDIA's ComputeDomain template gives)
// asks for a Preferred leaf, which two free nodes of two cliques in one
// leaf would satisfy; because of the channel it waits for one clique,
// holding nothing (its channel claims unallocated too), with an event
// naming the channel, while the same gang without channels runs across the
// two cliques. Once clique Y has room the gang runs there: gpulink
// allocates the GPU claims, kube-scheduler the channel claims (channel-0
// of each pod's node) and binds the pods.
func TestGangComputeDomain(t *testing.T) {
	e, cq := cliqueCluster(t, 2, 2)
	x1, x2, y1, y2 := e.node("x1"), e.node("x2"), e.node("y1"), e.node("y2")
	e.publishComputeDomains(x1, x2, y1, y2)
	ctrl := e.startController(4)
	defer ctrl.stop()
	// Each clique keeps one free node.
	e.blocker("block-x1", x1)
	e.blocker("block-y1", y1)

	cd := e.gangPodsOf(gangOf{Name: "cd", Size: 2, PodGroup: true, Level: "leaf", Templates: []string{"four", "channel"}})
	ev := e.waitEvent(cd[0], "gang cd: 2 pods × 4 GPUs: only 1 fit in one clique", time.Minute)
	if !strings.Contains(ev, "GangWaiting") || !strings.Contains(ev, "claims ComputeDomain channel") || !strings.Contains(ev, controllertest.ChannelClass) {
		t.Errorf("waiting event %q, want a GangWaiting naming the ComputeDomain channel claim and its class", ev)
	}
	t.Logf("ComputeDomain gang waits: %s", ev)

	// Without channels the same gang spans the cliques.
	plain := e.gangPodsOf(gangOf{Name: "plain", Size: 2, PodGroup: true, Level: "leaf"})
	nodes := e.boundNodes(plain, 2*time.Minute)
	if e.cliqueOf(nodes[0]) == e.cliqueOf(nodes[1]) {
		t.Errorf("gang without channels on %v, want one pod in each clique", nodes)
	}
	if n := e.allocatedCount(cd); n != 0 {
		t.Fatalf("%d claims of the waiting ComputeDomain gang allocated: it holds nothing, channels included", n)
	}
	for _, name := range append(plain, "block-y1") {
		e.deletePod(name)
	}

	nodes = e.boundNodes(cd, 2*time.Minute)
	e.inOneClique(t, "ComputeDomain gang", nodes, cq.y)
	for i, results := range e.allocatedOnNodes(t, cd, nodes) {
		for _, r := range results {
			if r.Driver == controllertest.ComputeDomainDriver && r.Device != "channel-0" {
				t.Errorf("channel claim of pod %s got %s, want channel-0", cd[i], r.Device)
			}
		}
	}
	if ev := e.waitEvent(cd[0], "GangPlaced", 30*time.Second); !strings.Contains(ev, "clique "+cq.y) {
		t.Errorf("placed event %q, want it to name clique %s", ev, cq.y)
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestGangComputeDomainChannelPerNode: NVIDIA's driver publishes one
// default channel per node, and kube-scheduler gives each pod's channel
// claim a channel of the pod's node, so a node holds one pod of a
// ComputeDomain gang however many GPUs it has free. A gang of 2 pods × 2
// GPUs, which a 4-GPU node would hold by its GPUs, waits, gated and
// holding nothing, while clique X has one node and clique Y one free node;
// then it runs in Y, one pod per node, its channels allocated by
// kube-scheduler. (Placed two to a node, one pod was refused by
// kube-scheduler after the gates were gone and the gang ran in part.)
func TestGangComputeDomainChannelPerNode(t *testing.T) {
	e, cq := cliqueCluster(t, 1, 2)
	x1, y1, y2 := e.node("x1"), e.node("y1"), e.node("y2")
	e.publishComputeDomains(x1, y1, y2)
	e.template("two", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2)}})
	ctrl := e.startController(4)
	defer ctrl.stop()
	e.blocker("block-y1", y1)

	cd := e.gangPodsOf(gangOf{Name: "cd", Size: 2, PodGroup: true, Templates: []string{"two", "channel"}})
	ev := e.waitEvent(cd[0], "gang cd: 2 pods × 2 GPUs: only 1 fit in one clique", time.Minute)
	t.Logf("ComputeDomain gang waits: %s", ev)
	for _, name := range cd {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.SchedulingGates) == 0 || p.Spec.NodeName != "" {
			t.Fatalf("pod %s of the waiting gang ungated or bound (node %q)", name, p.Spec.NodeName)
		}
	}
	if n := e.allocatedCount(cd); n != 0 {
		t.Fatalf("%d claims of the waiting ComputeDomain gang allocated", n)
	}

	e.deletePod("block-y1")
	nodes := e.boundNodes(cd, 2*time.Minute)
	if nodes[0] == nodes[1] {
		t.Errorf("ComputeDomain gang pods both on %s, want one per node", nodes[0])
	}
	e.inOneClique(t, "ComputeDomain gang", nodes, cq.y)
	e.allocatedOnNodes(t, cd, nodes)
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// TestGangRailsAligned: a gang of 2 pods × (2 GPUs + 1 NIC under one PCIe
// root, issue 22's claim) with gang-rails: aligned, on two nodes with a
// NIC per root (nic-k on rail k), one of whose rails is held by a
// singleton: the pods land on the two nodes with NICs of the same rail,
// not the held one, and the GangPlaced event names the rail.
func TestGangRailsAligned(t *testing.T) {
	e := setup(t, nil)
	var nodes []string
	for _, short := range []string{"r1", "r2"} {
		topo, err := controllertest.WithPCIeRoots(fixture(t, "pcie-switch-8.txt"),
			[]string{"pci0000:00", "pci0000:00", "pci0000:20", "pci0000:20", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"})
		if err != nil {
			t.Fatal(err)
		}
		name := e.node(short)
		e.addNode(name, topo)
		var nics []controllertest.NIC
		for k, root := range []string{"pci0000:00", "pci0000:20", "pci0000:80", "pci0000:a0"} {
			nics = append(nics, controllertest.NIC{Name: fmt.Sprintf("nic-%d", k), PCIeRoot: root})
		}
		e.publishNICs(name, nics)
		nodes = append(nodes, name)
	}
	e.template("gpus-nic", resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 2), controllertest.NICRequest("nic", 1)},
		Constraints: []resourceapi.DeviceConstraint{controllertest.MatchPCIeRoot()},
	})
	ctrl := e.startController(4)
	defer ctrl.stop()

	single := e.newPod("single", true, "gpus-nic")
	single.Spec.NodeSelector = map[string]string{corev1.LabelHostname: nodes[0]}
	held := e.nicsOf(e.startBound(single, time.Minute))[0]

	rails := e.gangPodsOf(gangOf{Name: "rails", Size: 2, PodGroup: true, Templates: []string{"gpus-nic"},
		Labels: map[string]string{gangs.LabelRails: gangs.RailsAligned}})
	bound := e.boundNodes(rails, 2*time.Minute)
	var got []string
	for _, name := range rails {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.nicsOf(p)...)
	}
	_, nic0, _ := strings.Cut(got[0], "/")
	_, nic1, _ := strings.Cut(got[1], "/")
	if bound[0] == bound[1] || nic0 != nic1 || strings.HasSuffix(held, "/"+nic0) {
		t.Errorf("aligned gang on %v with NICs %v, want two nodes, one rail, not the rail of %s (held)", bound, got, held)
	}
	ev := e.waitEvent(rails[0], "GangPlaced", 30*time.Second)
	if !strings.Contains(ev, "NIC rails "+controllertest.NICDriver+"="+strings.TrimPrefix(nic0, "nic-")) {
		t.Errorf("placed event %q, want it to name rail %s", ev, nic0)
	}
	t.Logf("aligned gang on %v with NICs %v (held: %s)", bound, got, held)
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}

// nicsOf returns "node/nic" of the NICs allocated to the pod's claims, and
// checks they sit on the node the pod is bound to.
func (e *env) nicsOf(p *corev1.Pod) []string {
	e.t.Helper()
	var out []string
	for _, c := range e.claimsOf(p) {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != controllertest.NICDriver {
				continue
			}
			if p.Spec.NodeName != "" && r.Pool != p.Spec.NodeName {
				e.t.Errorf("pod %s on %s got NIC %s of %s", p.Name, p.Spec.NodeName, r.Device, r.Pool)
			}
			out = append(out, r.Pool+"/"+r.Device)
		}
	}
	return out
}
