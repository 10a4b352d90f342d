package controller

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/gang"
)

// How an aligned gang's slots are counted per rail key (gang_rails.go).

// railSlotBound bounds each node's slots for a gang whose pods align
// their rails (maxPods when the pods ask for no other driver's devices):
// every pod of the gang on a node uses the NICs of one key, and a key of
// w rails of a driver holds at most its free NICs on those rails over w
// pods (railCap), which is at most the free NICs of one rail. So no node
// holds more of the gang than the most free NICs one rail has on a node,
// and planner.Slots, which plans every copy it counts, need not count
// beyond: on rail-optimized nodes (one NIC per rail) one copy per node
// instead of one per NIC (BenchmarkGangDecisionRails). At least 1, so
// that a gang with no free rail anywhere still gets its nodes' reasons.
// nodes are those the gang may be placed on. Called under the decision
// lock.
func (c *Controller) railSlotBound(rep *gangMember, nodes []*planner.NodeInventory, maxPods int) int {
	if !wantsForeign(rep) {
		return maxPods
	}
	type rail struct{ driver, rail string }
	most := 0
	perRail := map[rail]int{}
	for _, n := range nodes {
		fn := c.inv.Foreign(n.Node)
		if fn == nil {
			continue
		}
		rails := c.railsOn(n.Node)
		clear(perRail)
		for _, d := range fn.Devices {
			r, ok := rails[d.Key()]
			if !ok || c.ledger.ForeignHeld(d.Key()) {
				continue
			}
			k := rail{d.Driver, r}
			perRail[k]++
			most = max(most, perRail[k])
		}
		if most >= maxPods {
			return maxPods
		}
	}
	return max(most, 1)
}

// wantsForeign tells whether the representative pod's pending claims ask
// for other drivers' devices (NICs): only then are there rails to align.
func wantsForeign(rep *gangMember) bool {
	for _, ic := range rep.pending {
		if len(ic.Foreign) > 0 {
			return true
		}
	}
	return false
}

// railAsk is what railSlots counts a gang's slots per rail key for.
type railAsk struct {
	rep *gangMember
	own planner.Placement
	// fixed is the rails of the gang's placed pods, for its replacements:
	// only that key is counted ("": the keys are discovered).
	fixed string
	// firstRails are the rail keys of the representative pod's first copy
	// on the nodes planner.Slots counted (candidateQuery.firstRails; ""
	// for a plan without one): discoverRailKeys plans the others only.
	firstRails map[string]string
}

// railSlots fills the candidate nodes' AlignedSlots for a gang with
// aligned rails and tells whether alignment applies: false when the
// representative pod's claims ask for no other driver's devices (there
// is nothing to align). With a fixed key only that key is counted.
// Called under the decision lock.
func (c *Controller) railSlots(ctx context.Context, ask railAsk, nodes []gang.Node) bool {
	if !wantsForeign(ask.rep) {
		return false
	}
	keys := []string{ask.fixed}
	if ask.fixed == "" {
		keys = c.discoverRailKeys(ctx, ask, nodes)
	}
	v := railView{nodes: nodes}
	for i := range nodes {
		if nodes[i].Slots == 0 {
			continue
		}
		nodes[i].AlignedSlots = map[string]int{}
		v.room = append(v.room, i)
		v.rails = append(v.rails, c.railsOn(nodes[i].Name))
		v.invs = append(v.invs, c.inv.Node(nodes[i].Name))
	}
	for _, k := range keys {
		c.keySlots(ctx, ask, k, v)
	}
	return true
}

// railView is the candidate nodes of an aligned gang's decision with the
// rails of their devices (railsOn's maps, not copied: an aligned decision
// on 5,000 nodes spent about 6 ms merging them into one).
type railView struct {
	nodes []gang.Node
	// room are the indices of the nodes with slots; rails and invs their
	// rails and inventories (nil for a node gone since).
	room  []int
	rails []map[planner.DeviceKey]string
	invs  []*planner.NodeInventory
}

// keySlots counts each node's slots under the rail key: as many copies
// of the representative pod as fit with the node's NICs of the key's
// drivers on other rails taken as held, at most what the key's free NICs
// allow (railCap). planner.Slots counts them for the usual pods, all
// nodes at once, with those NICs held off in the count only (HeldOff),
// so that the counts are kept per key until a node changes, as without
// rails; for the others each node's NICs are held off in the ledger for
// its one-by-one trials.
func (c *Controller) keySlots(ctx context.Context, ask railAsk, key string, v railView) {
	var idx, most []int
	var invs []*planner.NodeInventory
	top := 0
	parts := parseRailKeyParts(key)
	for r, i := range v.room {
		name, inv := v.nodes[i].Name, v.invs[r]
		if inv == nil {
			continue
		}
		m := min(v.nodes[i].Slots, c.railCap(name, parts, v.rails[r]))
		if m == 0 {
			continue
		}
		idx, most, invs = append(idx, i), append(most, m), append(invs, inv)
		top = max(top, m)
	}
	if len(idx) == 0 {
		return
	}
	req := planner.SlotRequest{Pod: ask.rep.pod, Pending: ask.rep.pending, Placement: ask.own, Nodes: invs, Max: top,
		HeldOff: c.railsHeldOff(key)}
	counted, ok := c.planner.Slots(ctx, req)
	for j, i := range idx {
		var s int
		if ok {
			// A count up to top, bounded by the node's own most: the
			// count up to that most.
			s = min(counted[j].Slots, most[j])
		} else {
			release := c.holdOffRails(v.nodes[i].Name, key)
			s = c.trialSlots(ctx, ask.rep, ask.own, v.nodes[i].Name, most[j])
			release()
		}
		if s > 0 {
			v.nodes[i].AlignedSlots[key] = s
		}
	}
}

// discoverRailKeys are the alignment keys worth trying for the gang: the
// maxRailKeys most common rail keys of its representative pod's first
// plans on the candidate nodes (ask.firstRails where planner.Slots
// counted them).
func (c *Controller) discoverRailKeys(ctx context.Context, ask railAsk, nodes []gang.Node) []string {
	count := map[string]int{}
	for i := range nodes {
		if nodes[i].Slots == 0 {
			continue
		}
		if k, planned := ask.firstRails[nodes[i].Name]; planned {
			if k != "" {
				count[k]++
			}
			continue
		}
		for _, k := range c.plannedRailKeys(ctx, ask.rep, ask.own, nodes[i].Name, min(nodes[i].Slots, railDiscoveryPods)) {
			count[k]++
		}
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(count[b], count[a]), cmp.Compare(a, b)) })
	return keys[:min(len(keys), maxRailKeys)]
}

// railCap bounds the pods the node can take under a rail key by its free
// devices on the key's rails: a pod takes as many of each driver's devices
// as the key lists. It spares the planning that would fail (the second
// pod of a rail set on a node whose NICs are one per rail). rails are the
// node's (railsOn).
func (c *Controller) railCap(node string, key railKeyParts, rails map[planner.DeviceKey]string) int {
	fn := c.inv.Foreign(node)
	if fn == nil || key.malformed {
		return 0
	}
	most := -1
	for _, part := range key.parts {
		free := 0
		for _, d := range fn.Devices {
			if d.Driver != part.driver {
				continue
			}
			if r, has := rails[d.Key()]; has && part.allowed.Has(r) && !c.ledger.ForeignHeld(d.Key()) {
				free++
			}
		}
		if n := free / part.perPod; most < 0 || n < most {
			most = n
		}
	}
	return max(most, 0)
}

// railKeyParts is a rail key parsed once for railCap: per driver, the
// rails a pod's devices are on and how many it takes.
type railKeyParts struct {
	parts []railKeyPart
	// malformed is set for a key with a part that is no driver=rails.
	malformed bool
}

// railKeyPart is one driver's part of a rail key: the rails its devices
// may be on, and how many of them a pod takes (the rails listed).
type railKeyPart struct {
	driver  string
	allowed sets.Set[string]
	perPod  int
}

// parseRailKeyParts parses a rail key (railKey's "driver=r0,r1;..."); a
// part without "=" is skipped and makes it malformed, which bounds every
// node to 0 (railCap).
func parseRailKeyParts(key string) railKeyParts {
	var out railKeyParts
	for _, part := range strings.Split(key, ";") {
		drv, list, ok := strings.Cut(part, "=")
		if !ok {
			out.malformed = true
			continue
		}
		want := strings.Split(list, ",")
		out.parts = append(out.parts, railKeyPart{driver: drv, allowed: sets.New(want...), perPod: len(want)})
	}
	return out
}

// byDriver is the rails allowed per driver (the last part of a driver
// named twice).
func (k railKeyParts) byDriver() map[string]sets.Set[string] {
	out := make(map[string]sets.Set[string], len(k.parts))
	for _, p := range k.parts {
		out[p.driver] = p.allowed
	}
	return out
}

// plannedRailKeys plans copies of the representative pod on the node, one
// after the other (planCopies, as trialSlots counts them), and returns
// the rail key of each plan: the alignments the planner's own choice
// offers there.
func (c *Controller) plannedRailKeys(ctx context.Context, rep *gangMember, own planner.Placement, node string, maxPods int) []string {
	rails := c.railsOn(node)
	var keys []string
	c.planCopies(ctx, rep, own, node, maxPods, func(plan *planner.Plan) {
		if k, ok := railKey(plan, len(rep.pending), rails); ok && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	})
	return keys
}
