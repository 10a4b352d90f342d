package planner

import (
	"context"
	"fmt"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

// SelectorEvaluator compiles CEL device selectors once (k8s.io/dynamic-resource-allocation/cel)
// and evaluates them against gpulink devices.
type SelectorEvaluator struct {
	cache *dracel.Cache

	// probeMu guards probe: whether a class (by name and
	// resourceVersion) matches the driver-only probe device.
	probeMu sync.Mutex
	probe   map[string]bool

	// preparedMu guards prepared: the selectors PrepareSelectors has
	// evaluated on every node at the inventory's current generation.
	preparedMu sync.Mutex
	prepared   *preparedSelectors
}

func NewSelectorEvaluator() *SelectorEvaluator {
	// The features match Kubernetes 1.37 defaults: consumable capacity is
	// beta and on, list-typed attributes are alpha and off.
	return &SelectorEvaluator{cache: dracel.NewCache(1024, dracel.Features{EnableConsumableCapacity: true})}
}

// compile returns the compiled selector or a field-naming error.
func (e *SelectorEvaluator) compile(expr string) (dracel.CompilationResult, error) {
	r := e.cache.GetOrCompile(expr)
	if r.Error != nil {
		return r, fmt.Errorf("CEL selector %q does not compile: %w", expr, r.Error)
	}
	return r, nil
}

// matchesOnNode evaluates one selector on every device of a node, memoised
// on the node inventory (which is replaced whenever its slices change).
// Runtime errors (e.g. a missing attribute) count as no match for that
// device; they are kept so that a request matching nothing can say why.
func (e *SelectorEvaluator) matchesOnNode(ctx context.Context, n *NodeInventory, expr string) ([]selectorOutcome, error) {
	return e.matchesMemoised(ctx, n, expr, expr, len(n.Devices), func(i int) (string, dracel.Device) { return n.Devices[i].Name, n.Devices[i].CEL })
}

// probeDevice stands for "a gpulink device" before any slice exists: it
// matches class selectors that only test the driver name.
var probeDevice = dracel.Device{Driver: driver.Name, AllowMultipleAllocations: ptr.To(true)}

// migProbeDevice stands for "a gpulink MIG device" before any slice
// exists: a MIG class requires the profile attribute, which probeDevice
// lacks, and its claims must still count as gpulink's (and wait) rather
// than be handed to kube-scheduler.
var migProbeDevice = dracel.Device{Driver: driver.Name, AllowMultipleAllocations: ptr.To(false),
	Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{driver.AttrMIGProfile: {StringValue: ptr.To("1g.5gb")}}}

// ClassSelectsGpulink tells whether a DeviceClass selects gpulink devices:
// it must have at least one selector (a class without selectors matches
// every driver's devices, so it is not gpulink's), and its selectors must
// match the driver-only probe device or at least one published gpulink
// device.
func (e *SelectorEvaluator) ClassSelectsGpulink(ctx context.Context, class *resourceapi.DeviceClass, inv *Inventory) (bool, error) {
	var exprs []string
	for i, s := range class.Spec.Selectors {
		if s.CEL == nil {
			return false, fmt.Errorf("DeviceClass %s: spec.selectors[%d] has no cel expression; gpulink understands CEL selectors only", class.Name, i)
		}
		exprs = append(exprs, s.CEL.Expression)
	}
	if len(exprs) == 0 {
		return false, nil
	}
	progs := make([]dracel.CompilationResult, len(exprs))
	for i, x := range exprs {
		p, err := e.compile(x)
		if err != nil {
			return false, fmt.Errorf("DeviceClass %s: spec.selectors[%d]: %w", class.Name, i, err)
		}
		progs[i] = p
	}
	all := func(d dracel.Device) bool {
		for _, p := range progs {
			m, _, err := p.DeviceMatches(ctx, d)
			if err != nil || !m {
				return false
			}
		}
		return true
	}
	probeKey := class.Name + "@" + class.ResourceVersion
	e.probeMu.Lock()
	matched, known := e.probe[probeKey]
	e.probeMu.Unlock()
	if !known {
		matched = all(probeDevice) || all(migProbeDevice)
		e.probeMu.Lock()
		if e.probe == nil || len(e.probe) > 1024 {
			e.probe = map[string]bool{}
		}
		e.probe[probeKey] = matched
		e.probeMu.Unlock()
	}
	if matched {
		return true, nil
	}
	for _, n := range inv.All() {
		elig, _, err := e.eligibleBySelectors(ctx, n, exprs)
		if err != nil {
			return false, err
		}
		if slices.Contains(elig, true) {
			return true, nil
		}
		migElig, _, err := e.eligibleMIG(ctx, n, exprs)
		if err != nil {
			return false, err
		}
		if slices.Contains(migElig, true) {
			return true, nil
		}
	}
	return false, nil
}

// migMemoPrefix keeps the MIG rows of a node's selector memo apart from
// its GPU rows: both are indexed by position, in different lists.
const migMemoPrefix = "mig\x00"

// matchesMIGOnNode is matchesOnNode for the node's MIG devices, indexed
// as nodeInventory.MIG.
func (e *SelectorEvaluator) matchesMIGOnNode(ctx context.Context, n *NodeInventory, expr string) ([]selectorOutcome, error) {
	return e.matchesMemoised(ctx, n, migMemoPrefix+expr, expr, len(n.MIG), func(i int) (string, dracel.Device) { return n.MIG[i].Name, n.MIG[i].CEL })
}

// matchesMemoised evaluates expr on the count devices device gives, the
// row kept in the node's memo under key.
func (e *SelectorEvaluator) matchesMemoised(ctx context.Context, n *NodeInventory, key, expr string, count int, device func(int) (string, dracel.Device)) ([]selectorOutcome, error) {
	n.memoMu.Lock()
	row, ok := n.memo.get(key)
	n.memoMu.Unlock()
	if ok {
		return row, nil
	}
	prog, err := e.compile(expr)
	if err != nil {
		return nil, err
	}
	row = make([]selectorOutcome, count)
	for i := range count {
		// A row cut short by ctx is not kept: its devices would count as
		// not matching for later decisions (PrepareSelectors' deadline).
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("CEL selector %q on node %s: %w", expr, n.Node, err)
		}
		name, dev := device(i)
		m, _, err := prog.DeviceMatches(ctx, dev)
		if err != nil {
			err = fmt.Errorf("CEL selector %q on device %s/%s: %w", expr, n.Pool, name, err)
		}
		row[i] = selectorOutcome{match: m && err == nil, err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("CEL selector %q on node %s: %w", expr, n.Node, err)
	}
	n.memoMu.Lock()
	n.memo.put(key, row)
	n.memoMu.Unlock()
	return row, nil
}

// eligibleMIG is eligibleBySelectors for the node's MIG devices.
func (e *SelectorEvaluator) eligibleMIG(ctx context.Context, n *NodeInventory, exprs []string) ([]bool, error, error) {
	return eligibleByAll(len(n.MIG), exprs, func(x string) ([]selectorOutcome, error) { return e.matchesMIGOnNode(ctx, n, x) })
}

// eligibleBySelectors returns, per position, whether a device matches all
// selectors, plus the first runtime error seen (for messages).
func (e *SelectorEvaluator) eligibleBySelectors(ctx context.Context, n *NodeInventory, exprs []string) ([]bool, error, error) {
	return eligibleByAll(len(n.Devices), exprs, func(x string) ([]selectorOutcome, error) { return e.matchesOnNode(ctx, n, x) })
}

// eligibleByAll ANDs the rows of n devices that match gives for each
// selector, and returns the first runtime error of a device that did not
// match (for messages); an error of match itself is returned as is.
func eligibleByAll(n int, exprs []string, match func(string) ([]selectorOutcome, error)) ([]bool, error, error) {
	out := make([]bool, n)
	for i := range out {
		out[i] = true
	}
	var firstRuntime error
	for _, x := range exprs {
		row, err := match(x)
		if err != nil {
			return nil, nil, err
		}
		for i, o := range row {
			if !o.match {
				out[i] = false
				if o.err != nil && firstRuntime == nil {
					firstRuntime = o.err
				}
			}
		}
	}
	return out, firstRuntime, nil
}
