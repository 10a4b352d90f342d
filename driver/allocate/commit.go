package allocate

import (
	"fmt"
	"math/bits"
	"slices"
)

// Commit records a placement from Allocate or ChooseNode in n.Usage. It
// checks the whole placement before changing anything, so a failed Commit
// leaves n as it was.
func (n *NodeState) Commit(req Request, r Result) error {
	if err := n.checkResult(req, r); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if req.Share != nil {
		p := r.GPUs[0]
		if why := n.shareFit(p, req.Share); why != fits {
			return fmt.Errorf("commit: share on GPU at position %d: %s", p, misfitWords[why])
		}
		n.ensureUsage()
		u := &n.Usage[p]
		if u.Shares == 0 {
			u.Group = req.Share.Group
		}
		u.Shares++
		u.MemoryBytes += req.Share.MemoryBytes
		u.Cores += req.Share.Cores
		return nil
	}
	for _, p := range r.GPUs {
		if u := n.usage(p); u.Exclusive || u.Shares > 0 {
			return fmt.Errorf("commit: GPU at position %d is not free (exclusive=%t, shares=%d)", p, u.Exclusive, u.Shares)
		}
	}
	n.ensureUsage()
	for _, p := range r.GPUs {
		n.Usage[p].Exclusive = true
	}
	return nil
}

// Release undoes a Commit of the same request and result.
func (n *NodeState) Release(req Request, r Result) error {
	if err := n.checkResult(req, r); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if req.Share != nil {
		p := r.GPUs[0]
		u := n.usage(p)
		if u.Shares < 1 || u.MemoryBytes < req.Share.MemoryBytes || u.Cores < req.Share.Cores {
			return fmt.Errorf("release: GPU at position %d holds %d shares (%d bytes, %d cores), less than the share released",
				p, u.Shares, u.MemoryBytes, u.Cores)
		}
		if u.Shares == 1 && (u.MemoryBytes != req.Share.MemoryBytes || u.Cores != req.Share.Cores) {
			return fmt.Errorf("release: GPU at position %d: last share holds %d bytes and %d cores, released %d bytes and %d cores",
				p, u.MemoryBytes, u.Cores, req.Share.MemoryBytes, req.Share.Cores)
		}
		pu := &n.Usage[p]
		pu.Shares--
		pu.MemoryBytes -= req.Share.MemoryBytes
		pu.Cores -= req.Share.Cores
		if pu.Shares == 0 {
			pu.Group = ""
		}
		return nil
	}
	for _, p := range r.GPUs {
		if !n.usage(p).Exclusive {
			return fmt.Errorf("release: GPU at position %d is not given out whole", p)
		}
	}
	for _, p := range r.GPUs {
		n.Usage[p].Exclusive = false
	}
	return nil
}

// checkResult verifies that r is a well-formed placement of req on n.
func (n *NodeState) checkResult(req Request, r Result) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if err := n.Validate(); err != nil {
		return err
	}
	if r.Node != n.Name {
		return fmt.Errorf("result.node is %q, this node is %q", r.Node, n.Name)
	}
	want := req.GPUs
	if req.Share != nil {
		want = 1
	}
	if len(r.GPUs) != want {
		return fmt.Errorf("result.gpus has %d positions, the request needs %d", len(r.GPUs), want)
	}
	if !slices.IsSorted(r.GPUs) || len(slices.Compact(slices.Clone(r.GPUs))) != len(r.GPUs) {
		return fmt.Errorf("result.gpus must be ascending without duplicates, got %v", r.GPUs)
	}
	var set uint64
	for _, p := range r.GPUs {
		if p < 0 || p >= n.Topology.Len() {
			return fmt.Errorf("result.gpus: position %d out of range 0..%d", p, n.Topology.Len()-1)
		}
		set |= 1 << p
	}
	if err := checkEligible(n, req); err != nil {
		return err
	}
	if bad := set &^ eligibleMask(n, req); bad != 0 {
		return fmt.Errorf("result.gpus: position %d is not eligible for the request", bits.TrailingZeros64(bad))
	}
	if w := setKey(n.Topology, set).link(); len(r.GPUs) >= 2 && w < req.RequiredLink {
		return fmt.Errorf("result.gpus %v: weakest link %s is below the required %s", r.GPUs, w, req.RequiredLink)
	}
	return nil
}

func (n *NodeState) ensureUsage() {
	if n.Usage == nil {
		n.Usage = make([]GPUUsage, n.Topology.Len())
	}
}
