package planner

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver/allocate"
)

// SlotRequest asks how many copies of a pod fit on each of some nodes at
// once: a gang's slots, its pods being planned by the first one's claims.
type SlotRequest struct {
	Pod *corev1.Pod
	// Pending are the pod's gpulink claims to allocate.
	Pending []*Claim
	// Placement is the pod's own placement policy (PodPlacement).
	Placement Placement
	// Nodes are the nodes the node filter admitted for the pod
	// (NodeFilter.Candidates, with the pod's allocated claims).
	Nodes []*NodeInventory
	// Objects, when set, are the nodes' Node objects, parallel to Nodes
	// (NodeFilter.CandidateNodes); otherwise they are looked up.
	Objects []*corev1.Node
	// Max bounds the count per node (the gang's pods).
	Max int
	// HeldOff are other drivers' devices the count takes as held besides
	// the ledger's holds (an aligned gang's NICs of the other rails, the
	// controller's railSlots); the counts are kept under its key.
	HeldOff HeldOff
	// FirstForeign, when set, sees for each node (Nodes' index) with room
	// for a copy the other drivers' devices of the first copy's plan, and
	// whether the node was planned now (false: the count, and those
	// devices, were kept from an earlier one): the controller reads the
	// NIC rails the planner's own choice lands on from them (railSlots)
	// instead of planning each node again.
	FirstForeign func(node int, devices []DeviceKey, planned bool)
}

// NodeSlots is one node's answer to a SlotRequest.
type NodeSlots struct {
	// Slots is how many copies of the pod fit on the node at once.
	Slots int
	// FreeGPUs and TotalGPUs are the node's free and total GPUs
	// (GPUCounts).
	FreeGPUs, TotalGPUs int
}

// Slots counts, for each of req.Nodes, how many copies of the pod fit on
// it at once: what placing a copy (Decide with Only), assuming its
// devices and its pod, and again until one does not fit would count,
// without assuming anything. ok is false for pods it does not count
// that way (MIG devices, shares, pod (anti-)affinity terms): the caller
// then tries the copies one by one.
//
// Why it is exact for the others: with every request for whole GPUs and
// no MIG devices, Decide restricted to one node chooses planNode's plan
// on that node under the decision's policy, when the node filter admits
// the pod (quickChoice plans the node; the other paths plan it too; with
// other drivers' devices chooseForeign plans it with them, as here); a
// copy's devices, once assumed, show in the node's usage as given out
// whole, and its other drivers' devices as held, which is what the next
// copy is planned on here (the usage marked, the devices taken); and
// without affinity terms the node filter tells the copies apart by their
// CPU, memory, host ports and the like only (fitCheck.copies). The
// devices and the host resources stop the count independently, so the
// count is the lower of the two.
//
// What makes it cheap: nodes with fewer free GPUs than one copy takes are
// not planned, and the device count is kept per node until the node's
// usage generation, the holds on its other drivers' devices (NICs) or
// the policy change (slotCache), for a pod of one request of one
// alternative (a gang's usual shape) by that shape, for any other by its
// claims (slotShape): a decision plans only the nodes that changed since
// the last one for the shape, or since the same gang's last retry.
func (p *Planner) Slots(ctx context.Context, req SlotRequest) ([]NodeSlots, bool) {
	if !slotsCountable(req.Pod, req.Pending) {
		return nil, false
	}
	nodes := req.Nodes
	pol := req.Placement.apply(p.demand.policy(p.mix.Policy(ctx, p.policy, req.Pending), p.nodesNowOf(nodes)))
	var fc *fitCheck
	if p.filter.Fit != nil {
		fc = p.filter.Fit.check(req.Pod, p.filter.labelsOf)
	}
	shape := p.slotShape(req)
	// Other drivers' devices are planned with the GPUs (chooseForeign's
	// planning, one node at a time); their free state is the ledger's
	// holds, whose generation (ForeignGeneration) a kept count is valid
	// for, with the node's devices as they were.
	foreign := wantsForeign(req.Pending)
	gens := make([]uint64, len(nodes))
	p.ledger.Generations(nodes, gens)
	perPod := WholeGPUs(req.Pending)
	out := make([]NodeSlots, len(nodes))
	// What each node needs is read and kept in node order; the nodes
	// whose count is not kept are planned in parallel (parallel.go) in
	// between.
	counts := make([]slotCount, len(nodes))
	var toPlan []int
	var stamps []slotEntry // of the nodes to plan, for the counts kept
	for i, n := range nodes {
		var fview *ForeignNode
		var fgen uint64
		if foreign {
			fview = p.inv.Foreign(n.Node)
			fgen = p.ledger.ForeignGeneration(fview)
		}
		free, ok := p.slots.freeAt(n, gens[i])
		if !ok {
			free = p.ledger.FreeGPUs(n)
			p.slots.free[n] = freeEntry{gen: gens[i], free: free}
		}
		out[i] = NodeSlots{FreeGPUs: free, TotalGPUs: len(n.Devices)}
		limit := req.Max
		if perPod > 0 {
			// A node with F free GPUs holds at most F/g copies of g
			// whole GPUs: no planning beyond (nor below one copy).
			limit = min(limit, free/perPod)
		}
		if limit < 1 {
			continue
		}
		c := &counts[i]
		at := slotEntry{nodeStamp: nodeStamp{gen: gens[i], pol: pol, foreign: fview, foreignGen: fgen}, limit: limit}
		c.counted = true
		c.devices, c.first = shape.get(n, at)
		if c.planned = c.devices < 0; c.planned {
			toPlan, stamps = append(toPlan, i), append(stamps, at)
		}
	}
	planEach(p.parallelism, len(toPlan), func(j int) {
		i := toPlan[j]
		n, c := nodes[i], &counts[i]
		var fn *foreignNode
		if foreign {
			fn = &foreignNode{view: stamps[j].foreign, held: p.heldOn(req.HeldOff, n.Node), taken: map[DeviceKey]bool{}}
		}
		if foreign && foreignShortOn(ctx, p.sel, n, req.Pending, fn) != nil {
			c.devices = 0 // not one copy: as Decide's chooseForeign finds
			return
		}
		cp := copyPlanning{sel: p.sel, pol: pol, node: n, usage: p.ledger.NodeUsage(n), pending: req.Pending, limit: stamps[j].limit, foreign: fn}
		if foreign {
			cp.first = func(plan *Plan) { c.first = plan.ForeignKeys(len(req.Pending)) }
		}
		c.devices = cp.count(ctx)
	})
	for j, i := range toPlan {
		at, c := stamps[j], &counts[i]
		at.count, at.first = c.devices, c.first
		shape.put(nodes[i], at)
	}
	for i, n := range nodes {
		c := &counts[i]
		if !c.counted {
			continue
		}
		devices := c.devices
		if req.FirstForeign != nil && devices > 0 {
			req.FirstForeign(i, c.first, c.planned)
		}
		out[i].Slots = devices
		if fc != nil && devices > 0 {
			var node *corev1.Node
			if req.Objects != nil {
				node = req.Objects[i]
			} else if node, _ = p.filter.Nodes.Get(n.Node); node == nil {
				out[i].Slots = 0
				continue
			}
			out[i].Slots = fc.copies(node, devices, p.filter.mappedByDRA)
		}
	}
	if shape != nil {
		shape.byNode = prune(shape.byNode, p.inv)
	}
	p.slots.free = prune(p.slots.free, p.inv)
	return out, true
}

// slotCount is one node's count in Slots, with the first copy's other
// drivers' devices, kept or planned now (planned); a node without the
// free GPUs of one copy is not counted. Slots makes one per node per
// call, so the state a count is for is kept apart, for the nodes
// planned only.
type slotCount struct {
	devices          int
	first            []DeviceKey
	counted, planned bool
}

// slotsCountable tells whether Slots counts the pod's copies itself:
// every alternative of every request is for whole GPUs (no shares, no MIG
// devices), no pod (anti-)affinity terms. Other drivers' devices (NICs
// beside the GPUs) are counted with them.
func slotsCountable(pod *corev1.Pod, pending []*Claim) bool {
	if len(pending) == 0 || len(requiredAffinity(pod)) > 0 || len(requiredAntiAffinity(pod)) > 0 {
		return false
	}
	for _, ic := range pending {
		for _, r := range ic.Requests {
			for _, alt := range r.Alternatives {
				if alt.Share || alt.MIG {
					return false
				}
			}
		}
	}
	return true
}

// copyPlanning is the copies of the pending claims to plan on one node.
type copyPlanning struct {
	sel     *SelectorEvaluator
	pol     allocate.Policy
	node    *NodeInventory
	pending []*Claim
	limit   int
	// usage is the caller's copy (NodeUsage's): the copies are marked in
	// it.
	usage []allocate.GPUUsage
	// foreign, for claims with other drivers' devices, is the node's view
	// of them: each copy's devices stay taken in it for the next, as the
	// ledger would hold them once the copy is assumed.
	foreign *foreignNode
	// first (if not nil) sees the first copy's plan.
	first func(*Plan)
}

// count plans copies one after the other, each on the usage the ones
// before it leave, up to the limit, and returns how many fit.
func (cp copyPlanning) count(ctx context.Context) int {
	count := 0
	for count < cp.limit {
		plan, _ := planNodeWith(ctx, cp.sel, cp.pol, cp.node, cp.usage, cp.pending, cp.foreign)
		if plan == nil {
			break
		}
		if count == 0 && cp.first != nil {
			cp.first(plan)
		}
		count++
		// As the ledger shows the copy once assumed: its GPUs given out
		// whole.
		for _, claim := range plan.Claims {
			for _, r := range claim {
				for _, pos := range r.Positions {
					cp.usage[pos].Exclusive = true
				}
			}
		}
	}
	return count
}

// slotCache keeps each node's device count of copies per pod shape
// between gang decisions, bounded to the shapes most recently asked for,
// and each node's free GPUs, until the node's usage generation changes.
// Keyed by inventory: a node whose devices change gets a new one.
type slotCache struct {
	shapes *lru[*slotShape]
	free   map[*NodeInventory]freeEntry
}

// freeEntry is a node's count of free GPUs at a usage generation.
type freeEntry struct {
	gen  uint64
	free int
}

func (c *slotCache) freeAt(n *NodeInventory, gen uint64) (int, bool) {
	e, ok := c.free[n]
	if !ok || e.gen != gen {
		return 0, false
	}
	return e.free, true
}

// maxSlotShapes bounds the shapes whose counts are kept (about 80 bytes a
// node each).
const maxSlotShapes = 8

func newSlotCache() *slotCache {
	return &slotCache{shapes: newLRU[*slotShape](maxSlotShapes), free: map[*NodeInventory]freeEntry{}}
}

// slotShape is the device counts of one shape by node; nil (for shapes
// not kept) keeps nothing.
type slotShape struct {
	byNode map[*NodeInventory]slotEntry
	// classes are the device classes a claims key names by address
	// (claimsKey), kept so that no other class takes an address while
	// the key is in use.
	classes []*resourceapi.DeviceClass
}

// slotEntry is a node's count, valid for the state it was counted on
// (nodeStamp), and for counts up to limit (a count below the limit at
// which it was computed is final).
type slotEntry struct {
	nodeStamp
	count, limit int
	// first are the other drivers' devices of the first copy's plan
	// (SlotRequest.FirstForeign).
	first []DeviceKey
}

// nodeStamp is what an answer kept for a node depends on besides the
// node's inventory (the key it is kept under): its usage generation, the
// policy, its other drivers' devices and their holds (foreign,
// foreignGen: nil and 0 for pods without such devices).
type nodeStamp struct {
	gen        uint64
	pol        allocate.Policy
	foreign    *ForeignNode
	foreignGen uint64
}

// slotShape returns the counts kept for the pending claims' shape. One
// claim of one request of one alternative for whole GPUs by count, no
// constraints, is kept by its quick signature, for every pod of that
// shape; any other (several requests or claims, constraints,
// firstAvailable, other drivers' devices) by the claims themselves
// (claimsKey): a waiting gang's retries, which count its representative
// pod's slots again, plan only the nodes that changed. nil keeps nothing
// (counted afresh on every decision). Decisions are serialized (the
// decision lock), so it needs no lock of its own.
func (p *Planner) slotShape(req SlotRequest) *slotShape {
	pending := req.Pending
	var key string
	var classes []*resourceapi.DeviceClass
	switch {
	case req.HeldOff.set():
		key, classes = claimsKey(pending)
		key = req.HeldOff.keptUnder(key)
	case len(pending) == 1 && len(pending[0].Requests) == 1 && len(pending[0].Constraints) == 0 && len(pending[0].Requests[0].Alternatives) == 1 && !wantsForeign(pending):
		alt := pending[0].Requests[0].Alternatives[0]
		if alt.All || alt.Share || alt.MIG || alt.Count < 1 {
			return nil
		}
		key = fmt.Sprintf("%s\x03%d/%d", quickSignature(alt), alt.Count, alt.RequiredLink)
	default:
		key, classes = claimsKey(pending)
	}
	if key == "" {
		return nil
	}
	s, ok := p.slots.shapes.get(key)
	if !ok {
		s = &slotShape{byNode: map[*NodeInventory]slotEntry{}, classes: classes}
		p.slots.shapes.put(key, s)
	}
	return s
}

// get returns the node's kept count for up to at.limit copies, with the
// first copy's other drivers' devices; -1 when none is valid for at's
// generations, policy and other drivers' devices.
func (s *slotShape) get(n *NodeInventory, at slotEntry) (int, []DeviceKey) {
	if s == nil {
		return -1, nil
	}
	limit := at.limit
	e, ok := s.byNode[n]
	if !ok || e.nodeStamp != at.nodeStamp {
		return -1, nil
	}
	switch {
	case e.count < e.limit:
		// The copies stopped fitting below the limit: final.
		return min(e.count, limit), e.first
	case limit <= e.limit:
		return limit, e.first
	}
	return -1, nil
}

func (s *slotShape) put(n *NodeInventory, e slotEntry) {
	if s != nil {
		s.byNode[n] = e
	}
}

// claimsKey identifies pending claims by what a plan reads of them: each
// claim by UID (a claim's spec never changes) and its classes by the
// informer's object (replaced, never changed, on every update), by
// address; it returns those classes, for the shape to keep (slotShape).
// "" for a claim without a UID or a request without a class.
func claimsKey(pending []*Claim) (string, []*resourceapi.DeviceClass) {
	var b strings.Builder
	var classes []*resourceapi.DeviceClass
	b.WriteString("claims")
	class := func(c *resourceapi.DeviceClass) bool {
		if c == nil {
			return false
		}
		fmt.Fprintf(&b, "\x03%p", c)
		classes = append(classes, c)
		return true
	}
	for _, ic := range pending {
		if ic.Claim == nil || ic.Claim.UID == "" {
			return "", nil
		}
		fmt.Fprintf(&b, "\x04%s", ic.Claim.UID)
		for _, r := range ic.Requests {
			for _, alt := range r.Alternatives {
				if !class(alt.Class) {
					return "", nil
				}
			}
		}
		for _, fr := range ic.Foreign {
			if !class(fr.Class) {
				return "", nil
			}
		}
	}
	return b.String(), classes
}

// prune drops the entries of inventories no longer current (nodes gone or
// republished), once they could make up half of the map.
func prune[V any](m map[*NodeInventory]V, inv *Inventory) map[*NodeInventory]V {
	if len(m) <= 2*inv.Len()+64 {
		return m
	}
	nodes := inv.All()
	keep := make(map[*NodeInventory]V, len(nodes))
	for _, n := range nodes {
		if e, ok := m[n]; ok {
			keep[n] = e
		}
	}
	return keep
}

// copies counts how many copies of the pod fit the node's resources at
// once, up to limit: the first as reject counts it (the pod itself), each
// further one under its own identity with the copies before it counted on
// the node, as a gang's slots are counted (Planner.Slots). Resources and
// host ports only: the callers count copies of pods without pod
// (anti-)affinity terms, which the affinity checks see alike whatever the
// copies.
func (fc *fitCheck) copies(node *corev1.Node, limit int, mappedByDRA func(corev1.ResourceName) bool) int {
	if limit < 1 {
		return 0
	}
	fc.t.mu.Lock()
	defer fc.t.mu.Unlock()
	var pods int
	var requested demand
	u := fc.t.Nodes[node.Name]
	if u != nil {
		pods, requested = u.pods, u.requested
	}
	firstPods, first := pods, requested
	var used portUse
	var own []hostPort
	if u != nil {
		used = u.ports
		if self, ok := u.members[fc.uid]; ok {
			firstPods--
			first = subtractDemand(requested, self.demand)
			own = self.ports
		}
	}
	if fc.resourcesLocked(node, firstPods, first, mappedByDRA) != "" || portsConflict(used, fc.ports, own) {
		return 0
	}
	if len(fc.ports) > 0 {
		// Every copy takes the same host ports: a second one on the node
		// would conflict with the first (kube-scheduler's NodePorts), so
		// a gang of pods with a hostPort holds one pod per node.
		return 1
	}
	n := 1
	for ; n < limit; n++ {
		with := make(demand, len(fc.demand))
		for name, v := range fc.demand {
			with[name] = requested[name] + int64(n)*v
		}
		if fc.resourcesLocked(node, pods+n, with, mappedByDRA) != "" {
			break
		}
	}
	return n
}
