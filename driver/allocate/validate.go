package allocate

import (
	"fmt"

	"github.com/gpulink/gpulink/driver/topology"
)

// maxShareCores is a whole GPU's compute in the units of ShareRequest.Cores.
const maxShareCores = 100

// Validate reports the first problem with the request, independent of any node.
func (r Request) Validate() error {
	if r.Eligible != nil && r.EligibleByNode != nil {
		return fmt.Errorf("request: eligible and eligibleByNode are mutually exclusive, got both")
	}
	if err := r.Host.validate("request.host"); err != nil {
		return err
	}
	if r.Share != nil {
		if r.GPUs != 0 {
			return fmt.Errorf("request: gpus and share are mutually exclusive, got gpus=%d and a share", r.GPUs)
		}
		if r.Share.MemoryBytes < 1 {
			return fmt.Errorf("request: share.memoryBytes must be >= 1, got %d", r.Share.MemoryBytes)
		}
		if r.Share.Cores < 1 || r.Share.Cores > maxShareCores {
			return fmt.Errorf("request: share.cores must be 1..%d, got %d", maxShareCores, r.Share.Cores)
		}
		if r.RequiredLink != topology.LinkNone {
			return fmt.Errorf("request: requiredLink applies to whole GPUs only, got %s with a share", r.RequiredLink)
		}
		return nil
	}
	if r.GPUs < 1 {
		return fmt.Errorf("request: gpus must be >= 1, got %d", r.GPUs)
	}
	if r.GPUs > topology.MaxGPUs {
		return fmt.Errorf("request: gpus must be <= %d, got %d", topology.MaxGPUs, r.GPUs)
	}
	if r.RequiredLink > topology.NVLink(topology.MaxNVLinkLanes) {
		return fmt.Errorf("request: requiredLink must be a link class up to %s, got %d",
			topology.NVLink(topology.MaxNVLinkLanes), uint8(r.RequiredLink))
	}
	return nil
}

// Validate reports an unknown strategy; empty strategies mean Binpack.
func (p Policy) Validate() error {
	if err := validStrategy("policy.node", p.Node); err != nil {
		return err
	}
	return validStrategy("policy.gpu", p.GPU)
}

func validStrategy(field string, s Strategy) error {
	switch s {
	case "", Binpack, Spread:
		return nil
	}
	return fmt.Errorf("%s: unknown strategy %q (want %s or %s)", field, string(s), Binpack, Spread)
}

// spread reports whether s asks for spreading; the zero value packs.
func (s Strategy) spread() bool { return s == Spread }

// Validate checks that the node's usage is consistent with its topology.
// Inconsistent usage would make every later decision wrong, so it is an
// error rather than something to repair silently.
func (n *NodeState) Validate() error {
	if n == nil {
		return fmt.Errorf("node: nil")
	}
	if n.Topology == nil {
		return fmt.Errorf("node %s: topology is nil", nodeLabel(n.Name))
	}
	if v := n.MemoryOvercommitPercent; v != 0 && (v < 100 || v > MaxMemoryOvercommitPercent) {
		return fmt.Errorf("node %s: memoryOvercommitPercent must be 0 or 100..%d, got %d", nodeLabel(n.Name), MaxMemoryOvercommitPercent, v)
	}
	if n.Host != nil {
		if err := n.Host.validate("node " + nodeLabel(n.Name) + ": host"); err != nil {
			return err
		}
	}
	if n.MaxSharesPerGPU < 0 {
		return fmt.Errorf("node %s: maxSharesPerGPU must be >= 0, got %d", nodeLabel(n.Name), n.MaxSharesPerGPU)
	}
	gpus := n.Topology.Len()
	if len(n.Usage) != 0 && len(n.Usage) != gpus {
		return fmt.Errorf("node %s: usage has %d entries for %d GPUs", nodeLabel(n.Name), len(n.Usage), gpus)
	}
	for p, u := range n.Usage {
		if err := u.validate(); err != nil {
			return fmt.Errorf("node %s: usage[%d]: %w", nodeLabel(n.Name), p, err)
		}
		// Shares of an over-committing class may hold more than the GPU's
		// memory; never more than the largest over-commit allows.
		if total := n.Topology.GPUs[p].MemoryBytes; total > 0 && u.MemoryBytes > total/100*MaxMemoryOvercommitPercent {
			return fmt.Errorf("node %s: usage[%d]: memoryBytes %d exceeds %d%% of the GPU's %d", nodeLabel(n.Name), p, u.MemoryBytes, MaxMemoryOvercommitPercent, total)
		}
	}
	return nil
}

func (u GPUUsage) validate() error {
	switch {
	case u.Shares < 0:
		return fmt.Errorf("shares must be >= 0, got %d", u.Shares)
	case u.MemoryBytes < 0:
		return fmt.Errorf("memoryBytes must be >= 0, got %d", u.MemoryBytes)
	case u.Cores < 0 || u.Cores > maxShareCores:
		return fmt.Errorf("cores must be 0..%d, got %d", maxShareCores, u.Cores)
	case u.Exclusive && (u.Shares != 0 || u.MemoryBytes != 0 || u.Cores != 0):
		return fmt.Errorf("exclusive GPU also holds %d shares (%d bytes, %d cores)", u.Shares, u.MemoryBytes, u.Cores)
	case u.Shares == 0 && (u.MemoryBytes != 0 || u.Cores != 0):
		return fmt.Errorf("no shares but %d bytes and %d cores consumed", u.MemoryBytes, u.Cores)
	case u.Shares == 0 && u.Group != "":
		return fmt.Errorf("no shares but sharing group %q", u.Group)
	}
	return nil
}

// checkEligible rejects an eligibility mask that does not describe this node.
func checkEligible(n *NodeState, req Request) error {
	if req.Eligible != nil && len(req.Eligible) != n.Topology.Len() {
		return fmt.Errorf("request: eligible has %d entries, node %s has %d GPUs",
			len(req.Eligible), nodeLabel(n.Name), n.Topology.Len())
	}
	if e, ok := req.EligibleByNode[n.Name]; ok && len(e) != n.Topology.Len() {
		return fmt.Errorf("request: eligibleByNode[%q] has %d entries, the node has %d GPUs",
			n.Name, len(e), n.Topology.Len())
	}
	return nil
}

// restricted reports whether the request limits eligible GPUs at all.
func (r Request) restricted() bool { return r.Eligible != nil || r.EligibleByNode != nil }

func nodeLabel(name string) string {
	if name == "" {
		return `""`
	}
	return name
}
