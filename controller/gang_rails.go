package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// NIC rail alignment across the pods of a gang (gangs.LabelRails).
//
// Each pod of a gang whose claims ask for GPUs and another driver's
// devices (RDMA NICs next to the GPUs, usage.md) is planned with its own
// alignment as any pod. On a rail-optimized network NIC k of every node
// hangs off leaf switch (rail) k, and traffic between NICs of different
// rails crosses the spine; a gang with gang-rails: aligned therefore gets
// NICs of the same rails on every node. A NIC's rail is its position
// among its driver's devices of the node's pool in natural name order
// (mlx5_0, mlx5_1, ..., mlx5_10), or the value of an attribute the NIC
// driver publishes (GangConfig.RailAttribute).
//
// driver/gang places such a gang per alignment key (gang.Request
// AlignRails, gang.Node.AlignedSlots): for each node, how many of the
// gang's pods fit when each uses the NICs of those rails. The controller
// finds the keys worth trying by planning the gang's first pod on each
// node (the rails the planner's own choice lands on: the first copy
// planner.Slots plans there while counting the node's slots, which for
// such a gang stop at the free NICs of one rail, railSlotBound), keeps
// the maxRailKeys most common, and counts each node's slots under each
// key with the node's NICs of other rails taken as held in the count
// (gang_rail_slots.go). The pods are
// then planned on their nodes with the same NICs held off, so each gets
// the rails of the chosen key. Devices a pod of the gang does not ask for
// are never held off.

// maxRailKeys bounds the alignment keys tried per gang decision: each
// costs one planning per candidate node.
const maxRailKeys = 8

// railDiscoveryPods bounds the copies of the gang's first pod planned on
// each node to find the rail keys worth trying: the planner's first
// choices on the nodes, which differ where nodes differ in what is free,
// give the common keys; planning every slot of every node cost 4 times an
// unaligned decision (BenchmarkGangDecisionRails).
const railDiscoveryPods = 1

// railTrials numbers the ledger entries that hold NICs off for a trial.
var railTrials atomic.Uint64

// railsOn maps each foreign device of the node to its rail (absent: it
// has none, when RailAttribute names an attribute it lacks or whose value
// cannot be part of a key). The map is shared: read-only.
func (c *Controller) railsOn(node string) map[planner.DeviceKey]string {
	fn := c.inv.Foreign(node)
	if fn == nil {
		return nil
	}
	return c.railMemo.of(node, fn, c.inv.Len(), c.railsOf)
}

// railMemo keeps railsOn's map per node for its other drivers' devices
// as they are (a ForeignNode is replaced, never changed, when they
// change), so that an aligned gang's decision does not sort every node's
// NICs again, several times (BenchmarkGangDecisionRails).
type railMemo struct {
	mu     sync.Mutex
	byNode map[string]railEntry
}

type railEntry struct {
	fn    *planner.ForeignNode
	rails map[planner.DeviceKey]string
}

// of returns the node's rails for fn, computed once per fn; the memo is
// emptied when it holds more than twice the nodes (those gone stay
// otherwise).
func (m *railMemo) of(node string, fn *planner.ForeignNode, nodes int, compute func(*planner.ForeignNode) map[planner.DeviceKey]string) map[planner.DeviceKey]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.byNode[node]; ok && e.fn == fn {
		return e.rails
	}
	if m.byNode == nil || len(m.byNode) > 2*nodes+64 {
		m.byNode = map[string]railEntry{}
	}
	rails := compute(fn)
	m.byNode[node] = railEntry{fn: fn, rails: rails}
	return rails
}

// railsOf is railsOn's map for the node's other drivers' devices fn.
func (c *Controller) railsOf(fn *planner.ForeignNode) map[planner.DeviceKey]string {
	type pool struct{ driver, pool string }
	byPool := map[pool][]*planner.ForeignDevice{}
	for _, d := range fn.Devices {
		k := pool{d.Driver, d.Pool}
		byPool[k] = append(byPool[k], d)
	}
	out := make(map[planner.DeviceKey]string, len(fn.Devices))
	for _, devs := range byPool {
		devs = slices.Clone(devs)
		slices.SortFunc(devs, func(a, b *planner.ForeignDevice) int { return naturalCompare(a.Name, b.Name) })
		for i, d := range devs {
			rail := strconv.Itoa(i)
			if attr := c.gangCfg.RailAttribute; attr != "" {
				rail = ""
				if a, ok := sliceformat.Lookup(d.CEL.Attributes, d.Driver, resourceapi.FullyQualifiedName(attr)); ok {
					switch {
					case a.IntValue != nil:
						rail = strconv.FormatInt(*a.IntValue, 10)
					case a.StringValue != nil && !strings.ContainsAny(*a.StringValue, ",;="):
						rail = *a.StringValue
					}
				}
			}
			if rail != "" {
				out[d.Key()] = rail
			}
		}
	}
	return out
}

// railKey is the alignment key of a plan's other drivers' devices:
// "driver=r1,r2" per driver, sorted, joined by ";". ok is false when the
// plan takes none, or one without a rail.
func railKey(plan *planner.Plan, claims int, rails map[planner.DeviceKey]string) (string, bool) {
	return railKeyOf(plan.ForeignKeys(claims), rails)
}

// railKeyOf is the alignment key of other drivers' devices (railKey).
func railKeyOf(devices []planner.DeviceKey, rails map[planner.DeviceKey]string) (string, bool) {
	byDriver := map[string][]string{}
	for _, d := range devices {
		r, ok := rails[d]
		if !ok {
			return "", false
		}
		byDriver[d.Driver] = append(byDriver[d.Driver], r)
	}
	if len(byDriver) == 0 {
		return "", false
	}
	parts := make([]string, 0, len(byDriver))
	for drv, rs := range byDriver {
		slices.SortFunc(rs, naturalCompare)
		parts = append(parts, drv+"="+strings.Join(rs, ","))
	}
	slices.Sort(parts)
	return strings.Join(parts, ";"), true
}

// parseRailKey is railKey's inverse: the rails allowed per driver (parts
// without "=" skipped).
func parseRailKey(key string) map[string]sets.Set[string] {
	return parseRailKeyParts(key).byDriver()
}

// holdOffRails holds, in the ledger, the node's devices of the key's
// drivers that are not on its rails, so that a planning on the node can
// only take devices of those rails; the returned function releases them.
// Called under the decision lock.
func (c *Controller) holdOffRails(node, key string) func() {
	noop := func() {}
	fn := c.inv.Foreign(node)
	if key == "" || fn == nil {
		return noop
	}
	off := offRails(parseRailKey(key), c.railsOn(node))
	var uses []planner.DeviceUse
	for _, d := range fn.Devices {
		if off(d.Key()) {
			uses = append(uses, planner.DeviceUse{Key: d.Key(), Exclusive: true})
		}
	}
	if len(uses) == 0 {
		return noop
	}
	uid := types.UID(fmt.Sprintf("gang-rails/%s/%d", node, railTrials.Add(1)))
	settle, ok := c.ledger.Assume(uid, uses)
	if !ok {
		return noop
	}
	return func() { settle("", false) }
}

// railsHeldOff holds off, on each node, what holdOffRails holds in the
// ledger, in the planning only (planner.HeldOff): a pod of a gang
// aligned on the key takes no device off its rails.
func (c *Controller) railsHeldOff(key string) planner.HeldOff {
	allowed := parseRailKey(key)
	return planner.HeldOff{Key: "rails " + key, On: func(node string) func(planner.DeviceKey) bool {
		return offRails(allowed, c.railsOn(node))
	}}
}

// offRails tells, for a node's devices (rails: railsOn's map), which a
// rail key (allowed, parsed) keeps a pod off: those of the key's drivers
// on a rail it does not list, or on none.
func offRails(allowed map[string]sets.Set[string], rails map[planner.DeviceKey]string) func(planner.DeviceKey) bool {
	return func(d planner.DeviceKey) bool {
		ok, restricted := allowed[d.Driver]
		if !restricted {
			return false
		}
		r, has := rails[d]
		return !has || !ok.Has(r)
	}
}

// placedRailKey is the rail key every placed pod of the gang uses (bound,
// or handed over with its claims allocated): its replacements keep to it.
// "" when no pod is placed, the placed pods' keys differ, or a placed
// pod's devices of other drivers have no rail.
func (c *Controller) placedRailKey(ctx context.Context, members []*gangMember) string {
	key := ""
	for _, m := range members {
		if m.gated() {
			continue
		}
		if len(m.pc.ours) == 0 {
			m.pc = c.collectClaims(ctx, m.pod)
		}
		node := m.pod.Spec.NodeName
		var devices []planner.DeviceKey
		for _, ic := range m.pc.ours {
			a := ic.Claim.Status.Allocation
			if a == nil {
				continue
			}
			if node == "" {
				node = allocatedNode(ic.Claim)
			}
			for _, r := range a.Devices.Results {
				if r.Driver != driver.Name {
					devices = append(devices, planner.DeviceKey{Driver: r.Driver, Pool: r.Pool, Device: r.Device})
				}
			}
		}
		if node == "" || len(devices) == 0 {
			continue
		}
		k, ok := railKeyOf(devices, c.railsOn(node))
		if !ok || (key != "" && k != key) {
			return ""
		}
		key = k
	}
	return key
}

// naturalCompare orders names with their digit runs as numbers:
// nic-2 before nic-10.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitRun(a), digitRun(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Or(cmp.Compare(len(na), len(nb)), cmp.Compare(na, nb)); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitRun(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}

// gangWaitNote is what a waiting gang's event adds to driver/gang's
// reason: why its level is a clique (computeDomainNote) and that its pods
// were counted per NIC rail.
func gangWaitNote(spec gangs.Spec, req gang.Request) string {
	note := computeDomainNote(spec)
	if req.AlignRails {
		note += "; pods counted per NIC rail (" + gangs.LabelRails + ": " + gangs.RailsAligned + "): at most one pod of the gang per node and rail set unless NICs share a rail"
	}
	return note
}
