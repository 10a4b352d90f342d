package planner

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// Devices held off in the planning (Request.HeldOff) are not chosen, a
// pod that waits for them keeps its nodes without room under the held-off
// key only (another key, or none, plans the nodes again), and a decision
// with them held off equals one with them held in the ledger.
func TestDecideHeldOffKeptUnderItsKey(t *testing.T) {
	twoNICs := []controllertest.NIC{nic("nic-0", "pci0000:00"), nic("nic-1", "pci0000:20")}
	p, ip, _ := nicCluster(t, twoNICs, twoNICs)
	ctx := context.Background()
	ic, _, err := ip.Interpret(ctx, nicClaim("w", 2, 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
	offNamed := func(key string, names ...string) HeldOff {
		return HeldOff{Key: key, On: func(node string) func(DeviceKey) bool {
			return func(d DeviceKey) bool {
				return d.Driver == controllertest.NICDriver && slices.Contains(names, d.Device)
			}
		}}
	}
	decide := func(h HeldOff) Decision { return p.Decide(ctx, Request{Pod: pod, Pending: []*Claim{ic}, HeldOff: h}) }
	claims, _ := claimsKey([]*Claim{ic})

	// Both NICs held off: no room anywhere, kept under the key.
	every := offNamed("every NIC", "nic-0", "nic-1")
	if d := decide(every); d.Chosen != nil {
		t.Fatalf("chose %s with every NIC held off", d.Chosen.Summarize())
	}
	if p.waiting.of(every.keptUnder(claims)) == nil {
		t.Fatal("nodes without room not kept under the held-off key")
	}
	if p.waiting.of(claims) != nil {
		t.Fatal("nodes without room kept under the claims alone: a decision without devices held off would read them")
	}
	// nic-0 alone held off: nic-1, under the second root, is chosen.
	d := decide(offNamed("nic-0", "nic-0"))
	if d.Chosen == nil {
		t.Fatalf("nothing chosen with nic-1 free: %v", d.Why)
	}
	for _, fr := range d.Chosen.ForeignResults(0) {
		for _, dev := range fr.Devices {
			if dev.Name != "nic-1" {
				t.Fatalf("chose %s, which is held off", dev.Name)
			}
		}
	}
	// Nothing held off: placed, nothing read from the kept misses.
	if d := decide(HeldOff{}); d.Chosen == nil {
		t.Fatalf("nothing chosen with nothing held off: %v", d.Why)
	}
	// The kept answer stands for its key: a marker put in place of a
	// node's reasons shows in the next decision with that key.
	const marker = "kept reason"
	m := p.waiting.of(every.keptUnder(claims))
	for n, e := range m.byNode {
		e.why = []string{marker}
		m.byNode[n] = e
	}
	if d := decide(every); !slices.Contains(d.Why, marker) {
		t.Fatalf("the kept answers were not used: %v", d.Why)
	}
	// Without a key nothing is kept.
	before := p.waiting.claims.len()
	if d := decide(HeldOff{On: every.On}); d.Chosen != nil || slices.Contains(d.Why, marker) {
		t.Fatalf("a held-off set without key: chosen %v, why %v", d.Chosen != nil, d.Why)
	}
	if p.waiting.claims.len() != before {
		t.Fatal("a held-off set without key kept its nodes without room")
	}

	// Held off in the planning or held in the ledger: the same decision.
	if _, ok := p.ledger.Assume("nic-0 everywhere", []DeviceUse{
		{Key: DeviceKey{Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-0"}, Exclusive: true},
		{Key: DeviceKey{Driver: controllertest.NICDriver, Pool: "n1", Device: "nic-0"}, Exclusive: true},
	}); !ok {
		t.Fatal("hold refused")
	}
	held := decide(HeldOff{})
	p.ledger.Forget("nic-0 everywhere")
	off := decide(offNamed("nic-0", "nic-0"))
	if held.Chosen == nil || off.Chosen == nil || held.Chosen.Summarize() != off.Chosen.Summarize() || len(held.Plans) != len(off.Plans) {
		t.Fatalf("held in the ledger: %v; held off: %v", held.Chosen != nil, off.Chosen != nil)
	}
}
