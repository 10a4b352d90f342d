package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestAlignedRailSlotsBoundedAndDiscoveredFromSlots: an aligned gang's
// slots per rail key are the same when each node's slots are counted
// only up to the free NICs of one rail (railSlotBound) and the rail keys
// are read from planner.Slots' first copy per node (firstRails) as when
// every copy is counted and each node is planned again for its key
// (discoverRailKeys), node by node, over rounds of random GPUs and NICs
// held; and each is what trying the copies one by one with the other
// rails' NICs held in the ledger gives (keySlots' HeldOff against
// holdOffRails). A second count with nothing changed holds nothing in
// the ledger, so the counts kept stay valid. Half the nodes cable two
// NICs to each of rails 0 and 1 (the rail attribute), so that a key
// holds two pods there and the bound is 2; the others one NIC per rail.
func TestAlignedRailSlotsBoundedAndDiscoveredFromSlots(t *testing.T) {
	railed := func(node string, rails ...int64) []runtime.Object {
		o := nicNode(t, node, railNICs())
		for _, obj := range o {
			switch v := obj.(type) {
			case *corev1.Node:
				v.Labels = map[string]string{corev1.LabelHostname: node, gang.LabelLeaf: "leaf-" + node[:2]}
			case *resourceapi.ResourceSlice:
				if v.Spec.Driver == controllertest.NICDriver {
					for i := range v.Spec.Devices {
						v.Spec.Devices[i].Attributes["rail"] = resourceapi.DeviceAttribute{IntValue: ptr.To(rails[i])}
					}
				}
			}
		}
		return o
	}
	objs := objs(classes(), []runtime.Object{controllertest.NICDeviceClass()})
	const nodes = 16
	for i := range nodes {
		name := fmt.Sprintf("n%d-%02d", i%2, i)
		if i%2 == 0 {
			objs = append(objs, railed(name, 0, 0, 1, 1)...)
		} else {
			objs = append(objs, railed(name, 0, 1, 2, 3)...)
		}
	}
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{RailAttribute: controllertest.NICDriver + "/rail"}}
	h := newHarnessWith(t, cfg, objs...)
	shapes := map[string]resourceapi.DeviceClaim{
		"two-one":          gpusAndNICs(2, 1),
		"one-one-anywhere": {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 1), controllertest.NICRequest("nic", 1)}},
		"gpus-only":        {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", 2)}},
	}
	names := slices.Sorted(maps.Keys(shapes))
	for _, name := range names {
		h.gangPodWith(name, "g-"+name, 1000, shapes[name], "1")
	}
	h.start()
	c := h.ctrl
	members := h.waitGangMembers(names, nodes)

	const maxPods = 8
	if got := c.railSlotBound(members["gpus-only"], c.inv.All(), maxPods); got != maxPods {
		t.Errorf("bound for a pod without NICs: %d, want %d (no rails to align)", got, maxPods)
	}
	rng := rand.New(rand.NewPCG(53, 7))
	held := runningHolds{}
	twoOnOneKey := false
	for round := range 8 {
		c.decideMu.Lock()
		for _, n := range c.inv.All() {
			held.release(n.Node)
			uses := append(randomGPUUses(rng, n), randomNICUses(rng, c.inv.Foreign(n.Node), 5)...)
			held.hold(c, n.Node, round, uses)
		}
		for _, name := range []string{"two-one", "one-one-anywhere"} {
			m := members[name]
			own := mustPlacement(t, m)
			bound := c.railSlotBound(m, c.inv.All(), maxPods)
			if bound > 2 {
				t.Errorf("round %d, pod %s: bound %d, but no rail has more than 2 NICs on a node", round, name, bound)
			}
			q := candidateQuery{rep: m, own: own, maxPods: maxPods, alignRails: true, firstRails: map[string]string{}}
			fast, _ := c.gangCandidates(h.ctx, q)
			if !c.railSlots(h.ctx, railAsk{rep: m, own: own, firstRails: q.firstRails}, fast) {
				t.Fatalf("pod %s: rails not aligned", name)
			}
			invs := c.inv.All()
			gens := make([]uint64, len(invs))
			c.ledger.Generations(invs, gens)
			foreignGens := make([]uint64, len(invs))
			for i, n := range invs {
				foreignGens[i] = c.ledger.ForeignGeneration(c.inv.Foreign(n.Node))
			}
			q = candidateQuery{rep: m, own: own, maxPods: maxPods, alignRails: true, firstRails: map[string]string{}}
			again, _ := c.gangCandidates(h.ctx, q)
			c.railSlots(h.ctx, railAsk{rep: m, own: own, firstRails: q.firstRails}, again)
			after := make([]uint64, len(invs))
			c.ledger.Generations(invs, after)
			for i, n := range invs {
				if after[i] != gens[i] || c.ledger.ForeignGeneration(c.inv.Foreign(n.Node)) != foreignGens[i] {
					t.Errorf("round %d, pod %s: node %s: counting again with nothing changed held devices in the ledger", round, name, n.Node)
				}
			}
			for i := range again {
				if !maps.Equal(again[i].AlignedSlots, fast[i].AlignedSlots) {
					t.Errorf("round %d, pod %s: node %s: slots per rail key %v, then %v with nothing changed", round, name, fast[i].Name, fast[i].AlignedSlots, again[i].AlignedSlots)
				}
			}
			full, _ := c.gangCandidates(h.ctx, candidateQuery{rep: m, own: own, maxPods: maxPods})
			c.railSlots(h.ctx, railAsk{rep: m, own: own}, full)
			keys := map[string]bool{}
			for i := range full {
				for k := range full[i].AlignedSlots {
					keys[k] = true
				}
			}
			if len(fast) != len(full) {
				t.Fatalf("round %d, pod %s: %d candidates bounded, %d not", round, name, len(fast), len(full))
			}
			some := 0
			for i := range full {
				if fast[i].Slots > bound {
					t.Errorf("round %d, pod %s: node %s: %d slots counted above the bound %d", round, name, fast[i].Name, fast[i].Slots, bound)
				}
				if !maps.Equal(fast[i].AlignedSlots, full[i].AlignedSlots) {
					t.Errorf("round %d, pod %s: node %s: slots per rail key %v bounded, %v counted in full (slots %d)",
						round, name, full[i].Name, fast[i].AlignedSlots, full[i].AlignedSlots, full[i].Slots)
				}
				for _, s := range full[i].AlignedSlots {
					some += s
					twoOnOneKey = twoOnOneKey || s >= 2
				}
				if full[i].Slots == 0 {
					continue
				}
				rails := c.railsOn(full[i].Name)
				for k := range keys {
					most := min(full[i].Slots, c.railCap(full[i].Name, parseRailKeyParts(k), rails))
					if most == 0 {
						continue
					}
					release := c.holdOffRails(full[i].Name, k)
					tried := c.trialSlots(h.ctx, m, own, full[i].Name, most)
					release()
					if tried != full[i].AlignedSlots[k] {
						t.Errorf("round %d, pod %s: node %s: key %s: %d slots counted, %d tried with the other rails held in the ledger", round, name, full[i].Name, k, full[i].AlignedSlots[k], tried)
					}
				}
			}
			if round == 0 && some == 0 {
				t.Fatalf("pod %s: no aligned slot anywhere in the first round: the test compares nothing", name)
			}
		}
		c.decideMu.Unlock()
	}
	if !twoOnOneKey {
		t.Error("no node held two pods on one rail key: the bound above 1 was never exercised")
	}
}
