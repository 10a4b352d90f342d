package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// gangPodWith creates a gated pod of a label gang with its own claim and
// the CPU request.
func (h *harness) gangPodWith(name, gangName string, size int, claim resourceapi.DeviceClaim, cpu string) *corev1.Pod {
	h.t.Helper()
	h.claim(name, claim)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{gangs.LabelGang: gangName, gangs.LabelSize: strconv.Itoa(size)}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "x",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
		},
	}
	out, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// TestGangSlotsMatchTrials: the slots gang decisions count (planner.Slots,
// kept per node between decisions) are, node by node, the slots trying
// the representative pod's copies one by one gives (trialSlots: the
// planner on the node, each copy's devices and pod assumed), and
// driver/gang then chooses the same placement from either, on a cluster
// of the eight 8-GPU node kinds with random GPU usage and CPU taken, for
// pods of several shapes (1 to 8 GPUs, NVLink required, two requests),
// over rounds that change some nodes' usage between decisions.
func TestGangSlotsMatchTrials(t *testing.T) {
	objs := classes()
	const nodes = 48
	for i := range nodes {
		name := fmt.Sprintf("n%02d", i)
		o := gpuNode(t, name, controllertest.EightGPUFixtures[i%len(controllertest.EightGPUFixtures)])
		n := o[0].(*corev1.Node)
		n.Labels[gang.LabelLeaf] = fmt.Sprintf("leaf-%d", i/8)
		n.Labels[gang.LabelSpine] = fmt.Sprintf("spine-%d", i/24)
		// CPU for one to four of the test's pods (24 CPUs each) on most
		// nodes: the host, not the GPUs, then bounds some nodes' slots.
		n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse([]string{"1000", "24", "48", "72", "100"}[i%5])
		objs = append(objs, o...)
	}
	h := newHarness(t, objs...)
	whole := func(n int64) resourceapi.DeviceClaim {
		return resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", n)}}
	}
	shapes := map[string]resourceapi.DeviceClaim{
		"one": whole(1), "two": whole(2), "three": whole(3), "eight": whole(8),
		"four-nvlink":  {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}, Config: []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()}},
		"two-requests": {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("a", 2), controllertest.WholeRequest("b", 1)}},
	}
	var names []string
	for name, spec := range shapes {
		// A gang far larger than its pods: the controller leaves them
		// waiting, the test decides.
		h.gangPodWith(name, "g-"+name, 1000, spec, "24")
		names = append(names, name)
	}
	h.start()
	c := h.ctrl
	members := h.waitGangMembers(names, nodes)

	rng := rand.New(rand.NewPCG(31, 8))
	inv := c.inv.All()
	held := runningHolds{}
	hosts := map[types.UID]bool{}
	logger := klog.FromContext(h.ctx)
	for round := range 10 {
		c.decideMu.Lock()
		// Change some nodes: their GPUs taken or released, pods of other
		// sizes counted on them or gone.
		for _, n := range inv {
			if round > 0 && rng.IntN(3) > 0 {
				continue
			}
			held.release(n.Node)
			held.hold(c, n.Node, round, randomGPUUses(rng, n))
			other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns, UID: types.UID(fmt.Sprintf("other/%s/%d", n.Node, round))},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(strconv.Itoa(rng.IntN(30)))}}}}}}
			c.fit.Assume(other, n.Node)
			hosts[other.UID] = true
		}
		for _, name := range names {
			m := members[name]
			own := mustPlacement(t, m)
			const maxPods = 6
			got, _ := c.gangCandidates(h.ctx, candidateQuery{rep: m, own: own, maxPods: maxPods})
			// The reference: every admitted node's copies tried one by one.
			cands, _ := c.filter.Candidates(logger, m.pod, c.inv.All(), m.allocatedClaims(), nil)
			var want []gang.Node
			for _, n := range cands {
				node, err := c.nodes.Get(n.Node)
				if err != nil {
					t.Fatal(err)
				}
				free, total := c.planner.GPUCounts(n.Node)
				want = append(want, gang.Node{Name: n.Node, Domains: c.hierarchy.Domains(node.Labels),
					Slots: c.trialSlots(h.ctx, m, own, n.Node, maxPods), FreeGPUs: free, TotalGPUs: total})
			}
			if !reflect.DeepEqual(got, want) {
				for i := range min(len(got), len(want)) {
					if !reflect.DeepEqual(got[i], want[i]) {
						t.Errorf("round %d, pod %s: node %s: counted %+v, tried %+v", round, name, want[i].Name, got[i], want[i])
					}
				}
				t.Fatalf("round %d, pod %s: %d candidates counted, %d tried", round, name, len(got), len(want))
			}
			if got, _ := c.planner.Slots(h.ctx, planner.SlotRequest{Pod: m.pod, Pending: m.pending, Placement: own, Nodes: cands, Max: maxPods}); got == nil {
				t.Fatalf("pod %s: slots not counted by the planner", name)
			}
			for pods := 1; pods <= 24; pods += 5 {
				req := gang.Request{Name: name, Pods: pods, GPUsPerPod: planner.WholeGPUs(m.pending)}
				pg, errG := gang.Place(c.hierarchy, req, got)
				pw, errW := gang.Place(c.hierarchy, req, want)
				if fmt.Sprint(errG) != fmt.Sprint(errW) || !reflect.DeepEqual(pg, pw) {
					t.Fatalf("round %d, pod %s, %d pods: placed %+v (%v) from counted slots, %+v (%v) from tried ones", round, name, pods, pg, errG, pw, errW)
				}
			}
		}
		c.decideMu.Unlock()
	}
}

// TestGangSlotsCountHostResources: a node with GPUs for two of a gang's
// pods but CPU for one takes one: the gang of two spans two nodes rather
// than waiting for a node that fits both (each further copy of the pod
// counts the copies before it on the node's CPU).
func TestGangSlotsCountHostResources(t *testing.T) {
	var objs = classes()
	for _, name := range []string{"a", "b"} {
		o := leafNode(t, name, "l1")
		o[0].(*corev1.Node).Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("40")
		objs = append(objs, o...)
	}
	h := newHarness(t, objs...).start()
	two := resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}}
	h.gangPodWith("p0", "train", 2, two, "24")
	h.gangPodWith("p1", "train", 2, two, "24")
	h.waitUngated("p0")
	h.waitUngated("p1")
	if nodes := h.allocatedNodes("p0", "p1"); !samePair(nodes["p0"], nodes["p1"], "a", "b") {
		t.Errorf("gang pods on %v, want one on each of a and b (CPU for one pod each)", nodes)
	}
	if e, ok := h.rec.find(ns+"/p1", report.ReasonGangPlaced); !ok || !contains(e.Note, "leaf l1") {
		t.Errorf("placed event %+v, want 2 pods in leaf l1", e)
	}
}

// TestGangSlotsWithNICsMatchTrials is TestGangSlotsMatchTrials for pods
// whose claims ask for NICs beside their GPUs (matchAttribute pcieRoot):
// planner.Slots counts their copies with the NICs, each copy's NICs taken
// for the next, and every node gets the slots the one-by-one trials give
// (their NICs held in the ledger), with random GPUs and NICs held and
// most nodes' CPU enough for one to four of the pods.
func TestGangSlotsWithNICsMatchTrials(t *testing.T) {
	objs := objs(classes(), []runtime.Object{controllertest.NICDeviceClass()})
	const nodes = 24
	for i := range nodes {
		o := leafNICNode(t, i)
		n := o[0].(*corev1.Node)
		n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse([]string{"1000", "24", "48", "72", "100"}[i%5])
		objs = append(objs, o...)
	}
	h := newHarness(t, objs...)
	shapes := map[string]resourceapi.DeviceClaim{
		"two-one": gpusAndNICs(2, 1), "one-one": gpusAndNICs(1, 1),
		"four-two-anywhere": {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 4), controllertest.NICRequest("nic", 2)}},
		"one-one-anywhere":  {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 1), controllertest.NICRequest("nic", 1)}},
	}
	var names []string
	for name, spec := range shapes {
		h.gangPodWith(name, "g-"+name, 1000, spec, "24")
		names = append(names, name)
	}
	slices.Sort(names)
	h.start()
	c := h.ctrl
	members := h.waitGangMembers(names, nodes)

	rng := rand.New(rand.NewPCG(47, 11))
	held := runningHolds{}
	logger := klog.FromContext(h.ctx)
	for round := range 8 {
		c.decideMu.Lock()
		for _, n := range c.inv.All() {
			if round > 0 && rng.IntN(3) > 0 {
				continue
			}
			held.release(n.Node)
			uses := append(randomGPUUses(rng, n), randomNICUses(rng, c.inv.Foreign(n.Node), 4)...)
			held.hold(c, n.Node, round, uses)
		}
		for _, name := range names {
			m := members[name]
			own := mustPlacement(t, m)
			const maxPods = 6
			cands, _ := c.filter.Candidates(logger, m.pod, c.inv.All(), m.allocatedClaims(), nil)
			counted, ok := c.planner.Slots(h.ctx, planner.SlotRequest{Pod: m.pod, Pending: m.pending, Placement: own, Nodes: cands, Max: maxPods})
			if !ok {
				t.Fatalf("pod %s: slots not counted by the planner", name)
			}
			some := 0
			for i, n := range cands {
				tried := c.trialSlots(h.ctx, m, own, n.Node, maxPods)
				if counted[i].Slots != tried {
					t.Errorf("round %d, pod %s: node %s: counted %d, tried %d", round, name, n.Node, counted[i].Slots, tried)
				}
				some += tried
			}
			if round == 0 && some == 0 {
				t.Fatalf("pod %s: no slots anywhere in the first round: the test compares nothing", name)
			}
		}
		c.decideMu.Unlock()
	}
}

// waitGangMembers waits until the controller's caches hold each named
// pod with its one gpulink claim, and nodes nodes, and returns the pods
// as gang members.
func (h *harness) waitGangMembers(names []string, nodes int) map[string]*gangMember {
	h.t.Helper()
	c := h.ctrl
	members := map[string]*gangMember{}
	h.eventually("gang pods' claims", func() bool {
		for _, name := range names {
			pod, err := c.pods.Pods(ns).Get(name)
			if err != nil {
				return false
			}
			m := &gangMember{pod: pod, key: ns + "/" + name}
			m.pc = c.collectClaims(h.ctx, pod)
			if len(m.pc.ours) != 1 || len(c.inv.All()) < nodes {
				return false
			}
			m.pending = m.pc.ours
			members[name] = m
		}
		return true
	})
	return members
}

// randomGPUUses takes about 3 in 8 of the node's GPUs.
func randomGPUUses(rng *rand.Rand, n *planner.NodeInventory) []planner.DeviceUse {
	var uses []planner.DeviceUse
	for _, d := range n.Devices {
		if rng.IntN(8) < 3 {
			uses = append(uses, planner.DeviceUse{Key: planner.DeviceKey{Pool: n.Pool, Device: d.Name}, Exclusive: true})
		}
	}
	return uses
}

// randomNICUses takes each of the node's other drivers' devices (NICs)
// with a chance of one in oneIn.
func randomNICUses(rng *rand.Rand, fn *planner.ForeignNode, oneIn int) []planner.DeviceUse {
	var uses []planner.DeviceUse
	for _, d := range fn.Devices {
		if rng.IntN(oneIn) == 0 {
			uses = append(uses, planner.DeviceUse{Key: d.Key(), Exclusive: true})
		}
	}
	return uses
}

// leafNICNode is node n<i> (two digits) with railNICs, in leaf-<i/8>.
func leafNICNode(t *testing.T, i int) []runtime.Object {
	name := fmt.Sprintf("n%02d", i)
	o := nicNode(t, name, railNICs())
	o[0].(*corev1.Node).Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: fmt.Sprintf("leaf-%d", i/8)}
	return o
}

// runningHolds are devices held in the ledger per node, as running pods
// would hold them.
type runningHolds map[string]func(string, bool)

func (r runningHolds) hold(c *Controller, node string, round int, uses []planner.DeviceUse) {
	if settle, ok := c.ledger.Assume(types.UID(fmt.Sprintf("test-running/%s/%d", node, round)), uses); ok {
		r[node] = settle
	}
}

func (r runningHolds) release(node string) {
	if settle, ok := r[node]; ok {
		settle("", false)
		delete(r, node)
	}
}

// mustPlacement is the member's own placement policy (PodPlacement).
func mustPlacement(t *testing.T, m *gangMember) planner.Placement {
	t.Helper()
	own, err := planner.PodPlacement(m.pod, m.pending)
	if err != nil {
		t.Fatal(err)
	}
	return own
}

// TestGangSlotsWithNICsKeptUntilNICsChange: planner.Slots keeps a GPU+NIC
// pod's count per node between decisions (by the pod's claims) and plans
// again exactly the nodes whose GPUs or NICs were held or let go since:
// a second count plans no node, and after only some nodes' NICs changed,
// those are the only ones planned and every count equals the one-by-one
// trials'. It fails when a count is kept across a change of the node's
// NICs alone.
func TestGangSlotsWithNICsKeptUntilNICsChange(t *testing.T) {
	objs := objs(classes(), []runtime.Object{controllertest.NICDeviceClass()})
	const nodes = 16
	for i := range nodes {
		objs = append(objs, leafNICNode(t, i)...)
	}
	h := newHarness(t, objs...)
	h.gangPodWith("p", "g", 1000, gpusAndNICs(2, 1), "1")
	h.start()
	c := h.ctrl
	m := h.waitGangMembers([]string{"p"}, nodes)["p"]
	own := mustPlacement(t, m)
	logger := klog.FromContext(h.ctx)

	rng := rand.New(rand.NewPCG(5, 29))
	gpusHeld, nicsHeld := runningHolds{}, runningHolds{}
	holdNICs := func(node string, round int) {
		nicsHeld.release(node)
		nicsHeld.hold(c, node, 1000+round, randomNICUses(rng, c.inv.Foreign(node), 2))
	}
	const maxPods = 4
	changedByNICs := 0
	for round := range 6 {
		c.decideMu.Lock()
		for _, n := range c.inv.All() {
			gpusHeld.release(n.Node)
			gpusHeld.hold(c, n.Node, round, randomGPUUses(rng, n))
			holdNICs(n.Node, round)
		}
		cands, _ := c.filter.Candidates(logger, m.pod, c.inv.All(), m.allocatedClaims(), nil)
		count := func() ([]planner.NodeSlots, map[string]bool) {
			planned := map[string]bool{}
			req := planner.SlotRequest{Pod: m.pod, Pending: m.pending, Placement: own, Nodes: cands, Max: maxPods,
				FirstForeign: func(i int, _ []planner.DeviceKey, now bool) {
					if now {
						planned[cands[i].Node] = true
					}
				}}
			counted, ok := c.planner.Slots(h.ctx, req)
			if !ok {
				t.Fatal("slots not counted by the planner")
			}
			return counted, planned
		}
		first, _ := count()
		if again, planned := count(); len(planned) > 0 || !slices.Equal(again, first) {
			t.Errorf("round %d: nothing changed, but nodes %v were planned again (counts %v, then %v)", round, slices.Sorted(maps.Keys(planned)), first, again)
		}
		changed := map[string]bool{}
		for _, i := range rng.Perm(len(cands))[:5] {
			changed[cands[i].Node] = true
			holdNICs(cands[i].Node, round+100)
		}
		after, planned := count()
		for node := range planned {
			if !changed[node] {
				t.Errorf("round %d: node %s planned again, though nothing of it changed", round, node)
			}
		}
		for i, n := range cands {
			tried := c.trialSlots(h.ctx, m, own, n.Node, maxPods)
			if after[i].Slots != tried {
				t.Errorf("round %d: node %s (NICs changed: %v): counted %d, tried %d", round, n.Node, changed[n.Node], after[i].Slots, tried)
			}
			if changed[n.Node] && after[i].Slots != first[i].Slots {
				changedByNICs++
			}
		}
		c.decideMu.Unlock()
	}
	if changedByNICs == 0 {
		t.Fatal("no count changed with the NICs alone: the test cannot tell a stale count from a kept one")
	}
}
