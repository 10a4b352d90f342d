package allocate

import (
	"slices"
	"strings"
)

// tie is the key nodes of equal score are ordered by: TieKey, else Name.
func (n *NodeState) tie() string {
	if n.TieKey != "" {
		return n.TieKey
	}
	return n.Name
}

// TopologyTieKey is the tie key of a node named name whose domains in the
// cluster's topology hierarchy are domains, tightest first as
// gang.Hierarchy.Domains and gang.Node.Domains give them (clique, ...,
// leaf, spine, zone; "" where the node has no domain at a level). The key
// holds them widest first, then the name, so that the nodes of a
// domain are contiguous in the order of these keys at every level (keys
// that share a prefix are), so ChooseNode, filling the first of equally
// scored nodes, packs one domain before opening the next and keeps the
// other domains whole for gangs. It is never empty (a node without
// domains keys as NUL and its name), so every node of a cluster given one
// is ordered by it.
func TopologyTieKey(domains []string, name string) string {
	n := len(name)
	for _, d := range domains {
		n += len(d) + 1
	}
	var b strings.Builder
	b.Grow(n + 1)
	for _, d := range slices.Backward(domains) {
		// NUL cannot occur in a label value, so a domain's nodes share the
		// prefix up to here and no other domain's key starts with it.
		b.WriteString(d)
		b.WriteByte(0)
	}
	b.WriteByte(0)
	b.WriteString(name)
	return b.String()
}
