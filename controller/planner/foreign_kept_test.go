package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// A GPU+NIC pod decided again and again (as a waiting pod is, after every
// change in the cluster) decides as a planner that keeps nothing would,
// whatever changed in between: GPUs or NICs held or let go, a node's NICs
// republished. chooseForeign keeps the nodes that had no room, with why.
func TestChooseForeignKeptMissesMatchFresh(t *testing.T) {
	const nodes = 8
	rng := rand.New(rand.NewPCG(11, 3))
	roots := []string{"pci0000:00", "pci0000:20", "pci0000:80", "pci0000:a0"}
	randomNICs := func() []controllertest.NIC {
		var out []controllertest.NIC
		for k := range rng.IntN(4) + 1 {
			out = append(out, nic(fmt.Sprintf("nic-%d", k), roots[rng.IntN(len(roots))]))
		}
		return out
	}
	nics := make([][]controllertest.NIC, nodes)
	for i := range nics {
		nics[i] = randomNICs()
	}
	p, ip, inv := nicCluster(t, nics...)
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
	pending := gpuNICShapes(t, ip)
	describe := describeDecision
	var held []types.UID
	changes := map[string]int{}
	kept := 0
	for step := range 300 {
		node := fmt.Sprintf("n%d", rng.IntN(nodes))
		n := inv.Node(node)
		switch k := rng.IntN(4); {
		case k == 0 && len(held) > 0:
			i := rng.IntN(len(held))
			p.ledger.Forget(held[i])
			held = slices.Delete(held, i, i+1)
			changes["released"]++
		case k == 1:
			var uses []DeviceUse
			for _, pos := range rng.Perm(len(n.Devices))[:rng.IntN(3)+1] {
				uses = append(uses, DeviceUse{Key: DeviceKey{Pool: n.Pool, Device: n.Devices[pos].Name}, Exclusive: true})
			}
			uid := types.UID(fmt.Sprintf("gpus-%d", step))
			if _, ok := p.ledger.Assume(uid, uses); ok {
				held = append(held, uid)
				changes["GPUs held"]++
			}
		case k == 2:
			f := p.inv.Foreign(node)
			if f == nil || len(f.Devices) == 0 {
				continue
			}
			d := f.Devices[rng.IntN(len(f.Devices))]
			uid := types.UID(fmt.Sprintf("nic-%d", step))
			if _, ok := p.ledger.Assume(uid, []DeviceUse{{Key: d.Key(), Exclusive: true}}); ok {
				held = append(held, uid)
				changes["NIC held"]++
			}
		default:
			s := controllertest.NICSlice(node, randomNICs())
			s.ResourceVersion = fmt.Sprintf("%d", 100+step)
			if err := inv.Upsert(s); err != nil {
				t.Fatal(err)
			}
			changes["NICs republished"]++
		}
		fresh, err := New(Config{Inventory: inv, Ledger: p.ledger, Filter: p.filter, Selectors: p.sel})
		if err != nil {
			t.Fatal(err)
		}
		for _, claims := range pending {
			req := Request{Pod: pod, Pending: claims}
			// Twice: the second decision, with nothing changed, answers
			// every node that had no room from what was kept.
			for range 2 {
				got, want := describe(p.Decide(ctx, req)), describe(fresh.Decide(ctx, req))
				if got != want {
					t.Fatalf("step %d (claim %s): decided %s, a planner that keeps nothing %s", step, claims[0].Claim.Name, got, want)
				}
			}
			if key, _ := claimsKey(claims); p.waiting.of(key) != nil {
				kept++
			}
		}
	}
	if kept == 0 || len(changes) < 4 {
		t.Fatalf("kept answers %d times, changes %v: the test exercised neither the kept answers nor every change", kept, changes)
	}
}

// gpuNICShapes interprets three GPU+NIC claims, each with its GPUs and
// NICs under one PCIe root: 2 GPUs and 1 NIC, 1 and 2, 3 and 1.
func gpuNICShapes(t *testing.T, ip *Interpreter) [][]*Claim {
	t.Helper()
	var pending [][]*Claim
	for i, shape := range [][2]int64{{2, 1}, {1, 2}, {3, 1}} {
		ic, _, err := ip.Interpret(context.Background(), nicClaim(fmt.Sprintf("w%d", i), shape[0], shape[1], nil))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, []*Claim{ic})
	}
	return pending
}

// describeDecision renders all a decision says, to compare two.
func describeDecision(d Decision) string {
	s := "nothing"
	if d.Chosen != nil {
		s = d.Chosen.Summarize()
	}
	return fmt.Sprintf("%s; %d plans; %s; why %q", s, len(d.Plans), d.Rejections.summary(d.Nodes), d.Why)
}

// A node with no room for a waiting GPU+NIC pod is not planned again
// until something of it changes: its kept reasons stand for it (a marker
// put in their place shows in the decision), and a GPU let go on it, a
// NIC held on it or its NICs republished each drop them. A pod that is
// placed keeps nothing: it is not decided again.
func TestChooseForeignKeepsMissesUntilNodeChanges(t *testing.T) {
	p, ip, inv := nicCluster(t, []controllertest.NIC{nic("nic-0", "pci0000:00")}, []controllertest.NIC{nic("nic-0", "pci0000:20")})
	ctx := context.Background()
	interpret := func(c *resourceapi.ResourceClaim) Request {
		ic, _, err := ip.Interpret(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return Request{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}, Pending: []*Claim{ic}}
	}
	req := interpret(nicClaim("w", 2, 1, nil))
	hold := func(uid types.UID, uses ...DeviceUse) {
		if _, ok := p.ledger.Assume(uid, uses); !ok {
			t.Fatalf("hold %s refused", uid)
		}
	}
	gpu := func(node string, pos int) DeviceUse {
		n := inv.Node(node)
		return DeviceUse{Key: DeviceKey{Pool: n.Pool, Device: n.Devices[pos].Name}, Exclusive: true}
	}
	// Each node's only NIC is under a root whose two GPUs are held: no
	// room on either.
	hold("gpus", gpu("n0", 0), gpu("n0", 1))
	hold("n1-gpus", gpu("n1", 2), gpu("n1", 3))
	const marker = "kept reason"
	mark := func() {
		t.Helper()
		if d := p.Decide(ctx, req); d.Chosen != nil {
			t.Fatalf("chose %s, want no room anywhere", d.Chosen.Summarize())
		}
		key, _ := claimsKey(req.Pending)
		m := p.waiting.of(key)
		if m == nil {
			t.Fatal("no misses kept")
		}
		e, ok := m.byNode[inv.Node("n0")]
		if !ok {
			t.Fatal("n0's miss not kept")
		}
		e.why = []string{marker}
		m.byNode[inv.Node("n0")] = e
	}
	kept := func() bool {
		return slices.Contains(p.Decide(ctx, req).Why, marker)
	}
	mark()
	if !kept() {
		t.Fatal("nothing changed, but n0 was planned again")
	}
	for _, tc := range []struct {
		name   string
		change func()
	}{
		{"a GPU let go", func() { p.ledger.Forget("gpus"); hold("gpus", gpu("n0", 0), gpu("n0", 1)) }},
		{"a NIC held", func() {
			hold("nic", DeviceUse{Key: DeviceKey{Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-0"}, Exclusive: true})
			p.ledger.Forget("nic")
		}},
		{"its NICs republished", func() {
			s := controllertest.NICSlice("n0", []controllertest.NIC{nic("nic-0", "pci0000:00")})
			s.ResourceVersion = "2"
			if err := inv.Upsert(s); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		mark()
		tc.change()
		if kept() {
			t.Errorf("%s on n0: its kept answer still used", tc.name)
		}
	}

	// n1's NIC held: no room there for a GPU and a NIC, room on n0.
	hold("n1-nic", DeviceUse{Key: DeviceKey{Driver: controllertest.NICDriver, Pool: "n1", Device: "nic-0"}, Exclusive: true})
	placed := interpret(nicClaim("placed", 1, 1, func(dc *resourceapi.DeviceClaim) { dc.Constraints = nil }))
	if d := p.Decide(ctx, placed); d.Chosen == nil || d.Chosen.Node.Node != "n0" || len(d.Why) == 0 {
		t.Fatalf("a GPU and a NIC without constraint: want n0 chosen, n1 without room (%v)", d.Why)
	}
	if key, _ := claimsKey(placed.Pending); p.waiting.of(key) != nil {
		t.Error("a pod that was placed kept its nodes without room")
	}
}
