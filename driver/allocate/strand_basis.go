package allocate

// StrandBasis is what the GPU one placement strands on one node depends
// on besides the demand mix: the GPU left of each of the node's GPUs
// before and after the placement, its CPU and memory left before and
// after, and its GPU product. A caller that keeps node scores between
// decisions (the controller) ranks a node under a new demand mix from it
// (NodeScore.WithStranded) without placing the request again: the score
// ScoreNode gives under that mix, the node and request unchanged.
type StrandBasis struct {
	before, after         []int32
	hostBefore, hostAfter *Host
	product               string
}

// ScoreNodeWithBasis is ScoreNode, with the placement's StrandBasis when
// the score ranks by the demand mix (Policy.Demand set and the request
// fits; nil otherwise).
func ScoreNodeWithBasis(n *NodeState, req Request, pol Policy) (NodeScore, *StrandBasis, bool, error) {
	s, set, ok, err := scoreNode(n, req, pol)
	if err != nil || !ok || !s.demand {
		return s, nil, ok, err
	}
	// One array for both: the GPU left before, then after.
	k := n.Topology.Len()
	both := make([]int32, 2*k)
	left := gpuLeft(n, both[:0])
	after := both[k:]
	copy(after, left)
	takeFrom(after, n, req, set)
	b := &StrandBasis{before: left[:k:k], after: after, hostAfter: hostAfter(n, req.Host), product: nodeProduct(n)}
	if n.Host != nil {
		// A copy: the caller's may change once it is scored.
		h := *n.Host
		b.hostBefore = &h
	}
	return s, b, true, nil
}

// WithStranded returns the score ranked under the demand mix d instead of
// the one it was computed with, b being the basis ScoreNodeWithBasis gave
// with it. d must not be nil.
func (a NodeScore) WithStranded(d *DemandMix, b *StrandBasis) NodeScore {
	a.strand = d.strandChange(b.before, b.after, b.hostBefore, b.hostAfter, b.product)
	return a
}
