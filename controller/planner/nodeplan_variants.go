package planner

import (
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// variant is one candidate set of devices for an alternative: a group of
// equal matchAttribute values and, for shares, equal consumption.
type variant struct {
	eligible []bool
	bound    []string
	share    *allocate.ShareRequest
	consumed map[resourceapi.QualifiedName]resource.Quantity
	label    string
	// trial is the allocator's answer for the first placement, computed
	// on the node state placeAlt will see.
	trial allocate.Result
}

// constrained is one matchAttribute constraint that applies to the
// request being placed, with every device's value of its attribute.
type constrained struct {
	ci     int // index in the claim's constraints (and in bound)
	attr   resourceapi.FullyQualifiedName
	values []attrValue
}

// variants splits the eligible devices into groups the alternative may
// draw from, best first: constraints already bound restrict the devices,
// unbound ones split them by attribute value; shares split by what they
// would consume. Groups the allocator cannot satisfy are dropped.
//
// A device's constrained values come from the node's memo (attrValues)
// and are compared as they are: no key is built nor bound values copied
// per device, only per group. Each device looked up its attributes and
// built a key string before, a fifth of a GPU+NIC pod's decision on
// 5,000 nodes (BenchmarkDecideGPUsWithNICs).
func (p *placer) variants(ic *Claim, alt *Alternative, base []bool, bound []string) []variant {
	var consBuf [4]constrained
	cons := consBuf[:0]
	for ci, c := range ic.Constraints {
		if c.appliesTo(alt.ResultName) {
			cons = append(cons, constrained{ci: ci, attr: c.Attr, values: p.node.attrValues(c.Attr)})
		}
	}
	groups := p.group(alt, cons, base, bound)
	if len(groups) == 0 {
		if len(ic.Constraints) > 0 {
			p.note("request %s: no device on node %s satisfies the claim's matchAttribute constraints together with the devices already chosen", alt.ResultName, p.node.Node)
		}
		return nil
	}
	slices.SortStableFunc(groups, func(a, b variant) int { return strings.Compare(a.label, b.label) })
	// The groups the allocator can satisfy, with its answer, in place.
	out := groups[:0]
	for _, v := range groups {
		p.state.MaxSharesPerGPU, p.state.MemoryOvercommitPercent = maxSharesPerGPU(alt), memoryOvercommit(alt)
		r, err := allocate.Allocate(p.state, p.firstRequest(alt, v), p.pol)
		if err != nil {
			p.note("request %s: %s", alt.ResultName, reasonOf(err))
			continue
		}
		v.trial = r
		out = append(out, v)
	}
	if !alt.Share {
		sort.SliceStable(out, func(i, j int) bool {
			a, b := out[i].trial, out[j].trial
			if a.WeakestLink != b.WeakestLink {
				return a.WeakestLink > b.WeakestLink
			}
			return a.AggregateLink > b.AggregateLink
		})
	}
	return out
}

// group splits the eligible devices into the alternative's groups,
// unsorted: a first pass finds each device's group (by its first
// device, rep), a second makes the groups, each allocation once. Grown
// group by group, the groups were the decision's largest allocation
// after the GPU usage copies.
func (p *placer) group(alt *Alternative, cons []constrained, base []bool, bound []string) []variant {
	devices := len(p.node.Devices)
	var memberBuf [topology.MaxGPUs]int
	var scBuf [topology.MaxGPUs]*shareCons
	member, scs := memberBuf[:0], scBuf[:0]
	if devices > topology.MaxGPUs {
		member, scs = make([]int, 0, devices), make([]*shareCons, 0, devices)
	}
	var repBuf [8]int
	reps := repBuf[:0]
	for pos, d := range p.node.Devices {
		member, scs = append(member, -1), append(scs, nil)
		if !base[pos] || !agrees(cons, bound, pos) {
			continue
		}
		if alt.Share {
			sc := p.node.shareCons(alt, pos)
			if sc.err != nil {
				p.note("request %s: device %s on node %s: %v", alt.ResultName, d.Name, p.node.Node, sc.err)
				continue
			}
			scs[pos] = sc
		}
		g := groupOf(reps, scs, cons, pos)
		if g < 0 {
			g = len(reps)
			reps = append(reps, pos)
		}
		member[pos] = g
	}
	if len(reps) == 0 {
		return nil
	}
	groups := make([]variant, len(reps))
	eligible := make([]bool, len(reps)*devices)
	for g, rep := range reps {
		groups[g] = newVariant(cons, bound, rep, scs[rep], eligible[g*devices:(g+1)*devices:(g+1)*devices])
	}
	for pos, g := range member {
		if g >= 0 {
			groups[g].eligible[pos] = true
		}
	}
	return groups
}

// agrees tells whether the device at pos has every constrained attribute
// as a scalar equal to the value bound so far, if any.
func agrees(cons []constrained, bound []string, pos int) bool {
	for _, c := range cons {
		v := c.values[pos]
		if !v.ok || (bound[c.ci] != "" && bound[c.ci] != v.key) {
			return false
		}
	}
	return true
}

// groupOf finds the group of the device at pos among the groups'
// first devices reps, -1 when none yet: the same constrained values and,
// for shares, the same consumption (scs, by device).
func groupOf(reps []int, scs []*shareCons, cons []constrained, pos int) int {
	for g, rep := range reps {
		if scs[pos] != nil && scs[pos].key != scs[rep].key {
			continue
		}
		same := true
		for _, c := range cons {
			if c.values[pos].key != c.values[rep].key {
				same = false
				break
			}
		}
		if same {
			return g
		}
	}
	return -1
}

// newVariant is the group of the device at pos, with its devices marked
// in eligible (all false): the values it binds and the label naming them
// ("attr=value;" per constraint, then the share's consumption key),
// which orders the groups.
func newVariant(cons []constrained, bound []string, pos int, sc *shareCons, eligible []bool) variant {
	g := variant{eligible: eligible, bound: append([]string(nil), bound...)}
	for _, c := range cons {
		g.bound[c.ci] = c.values[pos].key
		g.label += string(c.attr) + "=" + c.values[pos].key + ";"
	}
	if sc != nil {
		g.share, g.consumed = sc.share, sc.consumed
		g.label += sc.key
	}
	return g
}

// attrValue is a device's value of one attribute as matchAttribute
// compares it (attrKey); ok is false when the device lacks it or it is
// not a scalar.
type attrValue struct {
	key string
	ok  bool
}

// attrValueEntries bounds each node's memo of attribute values: claims
// constrain few attributes (pcieRoot, numaNode, a product), but any
// claim may name any.
const attrValueEntries = 16

// attrValues returns each device's value of the attribute, memoised per
// node inventory (a node whose devices change gets a new one), as the
// selectors are: every decision's variants read the same few constrained
// attributes of the same devices.
func (n *NodeInventory) attrValues(fq resourceapi.FullyQualifiedName) []attrValue {
	n.memoMu.Lock()
	if n.attrMemo == nil {
		n.attrMemo = newLRU[[]attrValue](attrValueEntries)
	}
	row, ok := n.attrMemo.get(string(fq))
	n.memoMu.Unlock()
	if ok {
		return row
	}
	row = make([]attrValue, len(n.Devices))
	for pos, d := range n.Devices {
		a, has := d.attr(fq)
		key, scalar := attrKey(a)
		row[pos] = attrValue{key: key, ok: has && scalar}
	}
	n.memoMu.Lock()
	n.attrMemo.put(string(fq), row)
	n.memoMu.Unlock()
	return row
}

// bindConstraints checks one device against the claim's matchAttribute
// constraints that apply to the request resultName, given the values
// bound so far (one per constraint, "" while unbound): ok when the device
// has every constrained attribute as a scalar equal to the bound value. It
// returns the values bound with the device and a key naming them, which
// groups the devices that agree.
func bindConstraints(constraints []matchConstraint, resultName string, bound []string, attr func(resourceapi.FullyQualifiedName) (resourceapi.DeviceAttribute, bool)) (nb []string, key string, ok bool) {
	nb = slices.Clone(bound)
	for ci, c := range constraints {
		if !c.appliesTo(resultName) {
			continue
		}
		a, has := attr(c.Attr)
		val, scalar := attrKey(a)
		if !has || !scalar || (nb[ci] != "" && nb[ci] != val) {
			return nil, "", false
		}
		nb[ci] = val
		key += string(c.Attr) + "=" + val + ";"
	}
	return nb, key, true
}
