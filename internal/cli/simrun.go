package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// StepOutcome is what one step did. Its JSON form is the line
// `gpulink simulate --output json` prints per step.
type StepOutcome struct {
	Step int    `json:"step"`
	Op   string `json:"op"`
	ID   string `json:"id"`
	// Node, GPUs (nvidia-smi indices) and Link describe a successful
	// allocation; Link is omitted for a single GPU.
	Node string `json:"node,omitempty"`
	GPUs []int  `json:"gpus,omitempty"`
	Link string `json:"link,omitempty"`
	// Memory and Cores are set for a share.
	Memory string `json:"memory,omitempty"`
	Cores  int64  `json:"cores,omitempty"`
	// Error says why an allocation could not be made; the run goes on.
	Error string `json:"error,omitempty"`

	// Table-only detail: for frees, where the GPUs were released; for
	// every step that touched a node, its whole GPUs free afterwards.
	freedNode string
	freedGPUs []int
	nodeFree  int
	nodeTotal int // 0 when the step touched no node
}

// liveAlloc is an allocation held between its alloc and free steps.
type liveAlloc struct {
	node int
	req  allocate.Request
	// res holds one result, or one per GPU of a share on several GPUs.
	res []allocate.Result
}

// simulate runs the steps in order against the nodes (which it changes)
// and returns one outcome per step. A request the nodes cannot meet is an
// outcome, not an error; an error means the allocator rejected its input,
// which validation should have prevented.
func simulate(ls *loadedScenario) ([]StepOutcome, error) {
	live := map[string]liveAlloc{}
	failed := map[string]int{} // id -> step whose allocation failed
	out := make([]StepOutcome, 0, len(ls.steps))
	for i, st := range ls.steps {
		o := StepOutcome{Step: i, Op: st.op, ID: st.id}
		var err error
		switch st.op {
		case opAlloc:
			err = runAlloc(ls, st, &o, live, failed)
		case opFree:
			err = runFree(ls, st, &o, live, failed)
		default:
			err = fmt.Errorf("unknown operation %q", st.op)
		}
		if err != nil {
			return out, fmt.Errorf("step %d (%s %s): %w", i, st.op, st.id, err)
		}
		out = append(out, o)
	}
	return out, nil
}

func runAlloc(ls *loadedScenario, st plannedStep, o *StepOutcome, live map[string]liveAlloc, failed map[string]int) error {
	var res allocate.Result
	var err error
	pol := ls.policy
	if ls.history != nil {
		// As the controller: the request counts before it is decided.
		if st.req.Share == nil {
			ls.history.Record(st.req.GPUs)
		}
		pol.Mix = ls.history.Mix()
	}
	var results []allocate.Result
	switch {
	case st.shareGPUs > 1:
		res, results, err = shareOnGPUs(ls, st, pol)
	case st.node >= 0:
		res, err = allocate.Allocate(ls.nodes[st.node], st.req, pol)
	default:
		res, err = allocate.ChooseNode(ls.nodes, st.req, pol)
	}
	if unsat := (*allocate.UnsatisfiableError)(nil); errors.As(err, &unsat) {
		o.Error = unsat.Reason
		failed[st.id] = o.Step
		return nil
	}
	if err != nil {
		return err
	}
	n := nodeByName(ls.nodes, res.Node)
	if n < 0 {
		return fmt.Errorf("allocator placed the request on unknown node %q", res.Node)
	}
	if results == nil {
		results = []allocate.Result{res}
	}
	for _, r := range results {
		if err := ls.nodes[n].Commit(st.req, r); err != nil {
			return err
		}
	}
	live[st.id] = liveAlloc{node: n, req: st.req, res: results}
	delete(failed, st.id)
	t := ls.nodes[n].Topology
	o.Node = res.Node
	o.GPUs = indicesOf(t, res.GPUs)
	if res.WeakestLink != topology.LinkNone {
		o.Link = res.WeakestLink.String()
	}
	if s := st.req.Share; s != nil {
		o.Memory = bytesString(s.MemoryBytes)
		o.Cores = s.Cores
	}
	o.nodeFree, o.nodeTotal = ls.nodes[n].FreeGPUs(), t.Len()
	return nil
}

func runFree(ls *loadedScenario, st plannedStep, o *StepOutcome, live map[string]liveAlloc, failed map[string]int) error {
	a, ok := live[st.id]
	if !ok {
		if at, wasFailed := failed[st.id]; wasFailed {
			o.Error = fmt.Sprintf("%s holds nothing: its allocation at step %d failed", st.id, at)
			delete(failed, st.id)
			return nil
		}
		return fmt.Errorf("no live allocation %q", st.id)
	}
	n := ls.nodes[a.node]
	var positions []int
	for _, r := range a.res {
		if err := n.Release(a.req, r); err != nil {
			return err
		}
		positions = append(positions, r.GPUs...)
	}
	delete(live, st.id)
	o.freedNode = n.Name
	o.freedGPUs = indicesOf(n.Topology, positions)
	o.nodeFree, o.nodeTotal = n.FreeGPUs(), n.Topology.Len()
	return nil
}

// shareOnGPUs places a share on st.shareGPUs distinct GPUs of one node
// (allocate.ShareSet, as the controller does): on the pinned node, or on
// the node whose set has the strongest weakest link (the first such node
// in the scenario's order). It returns the set as one result (for the
// outcome) and one result per GPU (to commit).
func shareOnGPUs(ls *loadedScenario, st plannedStep, pol allocate.Policy) (allocate.Result, []allocate.Result, error) {
	nodes := ls.nodes
	if st.node >= 0 {
		nodes = []*allocate.NodeState{ls.nodes[st.node]}
	}
	var best allocate.Result
	var reasons []string
	for _, n := range nodes {
		set, err := allocate.ShareSet(n, st.req, st.shareGPUs, pol)
		if unsat := (*allocate.UnsatisfiableError)(nil); errors.As(err, &unsat) {
			reasons = append(reasons, unsat.Reason)
			continue
		}
		if err != nil {
			return allocate.Result{}, nil, err
		}
		if set == nil {
			return allocate.Result{}, nil, fmt.Errorf("node %s: too many GPUs fit the share to compare every set of %d", n.Name, st.shareGPUs)
		}
		weakest := n.Topology.WeakestLink(set)
		if best.Node == "" || weakest > best.WeakestLink {
			best = allocate.Result{Node: n.Name, GPUs: set, WeakestLink: weakest, AggregateLink: n.Topology.LinkSum(set)}
		}
	}
	if best.Node == "" {
		return allocate.Result{}, nil, &allocate.UnsatisfiableError{Reason: strings.Join(reasons, "; ")}
	}
	per := make([]allocate.Result, len(best.GPUs))
	for i, p := range best.GPUs {
		per[i] = allocate.Result{Node: best.Node, GPUs: []int{p}}
	}
	return best, per, nil
}

func nodeByName(nodes []*allocate.NodeState, name string) int {
	for i, n := range nodes {
		if n.Name == name {
			return i
		}
	}
	return -1
}

// indicesOf turns allocator positions into the GPU indices users see.
func indicesOf(t *topology.Topology, positions []int) []int {
	out := make([]int, len(positions))
	for i, p := range positions {
		out[i] = t.GPUs[p].Index
	}
	return out
}
