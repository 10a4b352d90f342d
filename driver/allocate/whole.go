package allocate

import (
	"fmt"
	"math/bits"

	"github.com/gpulink/gpulink/driver/topology"
)

// pick is the outcome of a search on one node.
type pick struct {
	set   uint64 // positions
	key   key
	found bool
	// bestAny is the best set of the requested size ignoring RequiredLink,
	// kept to explain a failure.
	bestAny   key
	anyExists bool
}

// pickWhole searches one node for k whole GPUs from cand, a subset of the
// node's free GPUs: exactly when the free GPUs fit the exact table, by
// link-class components otherwise.
func pickWhole(sc *scratch, t *topology.Topology, free, cand uint64, k int, required topology.Link, tieBreak bool, mix *SizeMix) pick {
	if k == 1 {
		// One GPU has no pairs, so it meets every link requirement.
		required = topology.LinkNone
	}
	if bits.OnesCount64(free) <= exactMaxFree {
		return exactPick(sc, t, free, cand, k, required, tieBreak, mix)
	}
	return pickLarge(sc, t, free, cand, k, required, tieBreak, mix)
}

func allocateWhole(n *NodeState, req Request, mix *SizeMix) (Result, error) {
	free := freeMask(n)
	cand := free & eligibleMask(n, req)
	if bits.OnesCount64(cand) < req.GPUs {
		return Result{}, &UnsatisfiableError{Node: n.Name, Reason: tooFewReason(n, req, free, cand)}
	}
	if bits.OnesCount64(cand) == req.GPUs {
		return forcedWhole(n, req, cand)
	}
	sc := getScratch()
	p := pickWhole(sc, n.Topology, free, cand, req.GPUs, req.RequiredLink, true, mix)
	putScratch(sc)
	if !p.found {
		return Result{}, &UnsatisfiableError{Node: n.Name, Reason: fmt.Sprintf(
			"no %d free GPUs with %s on %s (best free set of %d: weakest link %s)",
			req.GPUs, linkPhrase(req.RequiredLink), nodeLabel(n.Name), req.GPUs, p.bestAny.link())}
	}
	return wholeResult(n.Name, p), nil
}

// forcedWhole is allocateWhole's answer when the eligible free GPUs are
// exactly as many as asked for: that set, if its links meet the request.
// The search weighs every subset of the node's free GPUs (the links of
// the GPUs it would leave free for the sizes to come) to choose among
// sets; here there is one. A claim of GPUs and NICs bound to one PCIe
// root asks this of each root of every node planned: on nodes with two
// GPUs per root, every one of its GPU requests
// (TestForcedWholeMatchesSearch checks the answers are the search's).
func forcedWhole(n *NodeState, req Request, set uint64) (Result, error) {
	k := setKey(n.Topology, set)
	if !k.qualifies(req.GPUs, req.RequiredLink) {
		return Result{}, &UnsatisfiableError{Node: n.Name, Reason: fmt.Sprintf(
			"no %d free GPUs with %s on %s (best free set of %d: weakest link %s)",
			req.GPUs, linkPhrase(req.RequiredLink), nodeLabel(n.Name), req.GPUs, k.link())}
	}
	return Result{Node: n.Name, GPUs: positions(set), WeakestLink: k.link(), AggregateLink: int(k.agg())}, nil
}

func wholeResult(node string, p pick) Result {
	return Result{
		Node:          node,
		GPUs:          positions(p.set),
		WeakestLink:   p.key.link(),
		AggregateLink: int(p.key.agg()),
	}
}

func tooFewReason(n *NodeState, req Request, free, cand uint64) string {
	total, nf, nc := n.Topology.Len(), bits.OnesCount64(free), bits.OnesCount64(cand)
	if nc == nf {
		return fmt.Sprintf("only %d of %d GPUs free on %s, need %d", nf, total, nodeLabel(n.Name), req.GPUs)
	}
	return fmt.Sprintf("only %d eligible free GPUs on %s (%d of %d free), need %d",
		nc, nodeLabel(n.Name), nf, total, req.GPUs)
}

// linkPhrase words a required link class for messages.
func linkPhrase(required topology.Link) string {
	if required == topology.LinkNVLink {
		return "every pair NVLink"
	}
	return fmt.Sprintf("every pair %s or better", required)
}
