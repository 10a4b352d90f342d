package planner

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// With several unusable pools and no usable node, the waiting message
// names the same pool every time: the explainer records a message once
// only while it repeats exactly.
func TestWaitingMessageStableWithUnusablePools(t *testing.T) {
	inv := NewInventory()
	p, err := New(Config{Inventory: inv, Ledger: NewLedger(), Filter: &NodeFilter{}, Selectors: NewSelectorEvaluator()})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"c", "a", "d", "b"} {
		s := controllertest.V100Slice(t, node)
		s.Spec.Pool.ResourceSliceCount = 2
		if err := inv.Upsert(s); err == nil {
			t.Fatalf("incomplete pool %s accepted", node)
		}
	}
	first := p.WaitingMessage(nil, Decision{})
	if !strings.Contains(first, "pool a unusable") {
		t.Errorf("message %q does not name pool a, the first by name", first)
	}
	for range 50 {
		if msg := p.WaitingMessage(nil, Decision{}); msg != first {
			t.Fatalf("waiting message changed between calls:\n%s\n%s", first, msg)
		}
	}
}

// nodeMap serves Node objects from a map (the controller's Node lister in
// production).
type nodeMap map[string]*corev1.Node

func (m nodeMap) Get(name string) (*corev1.Node, error) {
	if n, ok := m[name]; ok {
		return n, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
}

// decideCluster is a Planner over nodes of the named topology fixtures
// (node name = fixture's index: "n0", "n1", ...) and an interpreter for
// the shipped DeviceClasses.
func decideCluster(t *testing.T, fixtures ...string) (*Planner, *Interpreter) {
	t.Helper()
	inv := NewInventory()
	nodes := nodeMap{}
	for i, f := range fixtures {
		topo, err := controllertest.ParseFixture(f)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("n%d", i)
		s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
		nodes[name] = controllertest.Node(name)
	}
	classes := controllertest.ClassLister{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	sel := NewSelectorEvaluator()
	p, err := New(Config{Inventory: inv, Ledger: NewLedger(), Filter: &NodeFilter{Nodes: nodes, Classes: classes, Fit: NewFitTracker()}, Selectors: sel})
	if err != nil {
		t.Fatal(err)
	}
	return p, NewInterpreter(classes, sel, inv)
}

func decideRequest(t *testing.T, ip *Interpreter, gpus int64, excluded ...string) Request {
	t.Helper()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d", UID: "c-uid"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", gpus)}}}}
	ic, kind, err := ip.Interpret(context.Background(), claim)
	if err != nil || kind != ClaimOurs {
		t.Fatalf("interpret: kind %v, err %v", kind, err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
	return Request{Pod: pod, Pending: []*Claim{ic}, Excluded: sets.New(excluded...)}
}

// Decide picks the node where four GPUs are linked best: an NVSwitch DGX
// A100 over a PCIe switch tree, whichever comes first.
func TestDecideChoosesBestLinkedNode(t *testing.T) {
	p, ip := decideCluster(t, "pcie-switch-8.txt", "dgx-a100.txt")
	d := p.Decide(context.Background(), decideRequest(t, ip, 4))
	if d.Chosen == nil {
		t.Fatalf("nothing chosen: %s", p.WaitingMessage(nil, d))
	}
	if got := d.Chosen.Node.Node; got != "n1" {
		t.Errorf("chose %s (%s), want n1, the DGX A100", got, d.Chosen.Summarize())
	}
	if d.Nodes != 2 || d.ExclusionsIgnored {
		t.Errorf("decision %+v: want 2 nodes and the exclusions kept", d)
	}
}

// Exclusions that rule out every node are ignored (and said so), rather
// than leaving the pod waiting for a condition that may have cleared;
// exclusions that leave a node are kept.
func TestDecideExclusions(t *testing.T) {
	p, ip := decideCluster(t, "pcie-switch-8.txt", "dgx-a100.txt")
	d := p.Decide(context.Background(), decideRequest(t, ip, 4, "n1"))
	if d.Chosen == nil || d.Chosen.Node.Node != "n0" || d.ExclusionsIgnored {
		t.Fatalf("with n1 excluded: chosen %v, exclusions ignored %v; want n0 and kept", d.Chosen, d.ExclusionsIgnored)
	}
	d = p.Decide(context.Background(), decideRequest(t, ip, 4, "n0", "n1"))
	if d.Chosen == nil || !d.ExclusionsIgnored {
		t.Fatalf("with every node excluded: chosen %v, exclusions ignored %v; want a node and ignored", d.Chosen, d.ExclusionsIgnored)
	}
}

// Nothing fits: no plan, and the waiting message counts the node and
// names what was asked for.
func TestDecideWaitsWhenNothingFits(t *testing.T) {
	p, ip := decideCluster(t, "pcie-4.txt")
	req := decideRequest(t, ip, 8)
	d := p.Decide(context.Background(), req)
	if d.Chosen != nil {
		t.Fatalf("chose %s for 8 GPUs on a 4-GPU node", d.Chosen.Summarize())
	}
	msg := p.WaitingMessage(req.Pending, d)
	if want := "0/1 nodes"; !strings.Contains(msg, want) || !strings.Contains(msg, "8") {
		t.Errorf("waiting message %q: want %q and the 8 GPUs asked for", msg, want)
	}
}

// A decision restricted to one node (a gang's pod on the node its
// placement chose) keeps the scores of the other nodes: the next pod's
// decision over every node scores none of them again.
func TestDecideOnOneNodeKeepsOtherScores(t *testing.T) {
	fixtures := make([]string, 100)
	for i := range fixtures {
		fixtures[i] = "dgx-a100.txt"
	}
	p, ip := decideCluster(t, fixtures...)
	ctx := context.Background()
	if d := p.Decide(ctx, decideRequest(t, ip, 2)); d.Chosen == nil {
		t.Fatal("no node for 2 GPUs")
	}
	kept := p.scores.entries()
	if kept < len(fixtures) {
		t.Fatalf("%d scores kept after a decision over %d nodes", kept, len(fixtures))
	}
	only := decideRequest(t, ip, 2)
	only.Only = "n42"
	if d := p.Decide(ctx, only); d.Chosen == nil || d.Chosen.Node.Node != "n42" {
		t.Fatalf("decision on n42 chose %+v", d.Chosen)
	}
	if got := p.scores.entries(); got < kept {
		t.Errorf("%d scores kept after a decision on one node, %d before", got, kept)
	}
	before := nodesScored.Load()
	if d := p.Decide(ctx, decideRequest(t, ip, 2)); d.Chosen == nil {
		t.Fatal("no node for 2 GPUs")
	}
	if scored := nodesScored.Load() - before; scored > 1 {
		t.Errorf("%d nodes scored again after a decision on one node, want none but n42 (its own usage unchanged too)", scored)
	}
}
