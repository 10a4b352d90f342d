package topology

// The links attribute
//
// Every device of a node's ResourceSlice carries one string attribute,
// "links", holding its GPU's row of the node's link matrix, so that the
// controller can rebuild the whole matrix from the published devices
// alone. Character j of the row of GPU i describes the link from GPU i to
// the GPU whose nvidia-smi index is j, for j = 0 .. the largest GPU index
// on the node (so every row of a node has the same length):
//
//	X        j == i, the GPU itself
//	.        no GPU with index j on this node (a GPU fell off the bus)
//	S        SYS
//	N        NODE
//	H        PHB
//	B        PXB
//	P        PIX
//	1 .. 9   NV1 .. NV9
//	a .. i   NV10 .. NV18
//
// Example: the row of GPU0 on a DGX-1 style hybrid cube mesh is "X112SS2S".
// Attribute strings are at most 64 characters, which bounds the largest
// GPU index a node may have to 63.

import (
	"fmt"
	"sort"
)

// maxLinksLen is the API's limit on string attribute values.
const maxLinksLen = 64

const (
	linkCharSelf   = 'X'
	linkCharAbsent = '.'
)

// linkChar returns the character of a link class in the links attribute.
func linkChar(l Link) (byte, error) {
	switch {
	case l.IsNVLink() && l.Lanes() <= 9:
		return byte('0' + l.Lanes()), nil
	case l.IsNVLink() && l.Lanes() <= MaxNVLinkLanes:
		return byte('a' + l.Lanes() - 10), nil
	case l == LinkPIX:
		return 'P', nil
	case l == LinkPXB:
		return 'B', nil
	case l == LinkPHB:
		return 'H', nil
	case l == LinkNODE:
		return 'N', nil
	case l == LinkSYS:
		return 'S', nil
	}
	return 0, fmt.Errorf("link class %s has no links-attribute character", l)
}

// parseLinkChar is the inverse of linkChar.
func parseLinkChar(c byte) (Link, bool) {
	switch {
	case c >= '1' && c <= '9':
		return NVLink(int(c - '0')), true
	case c >= 'a' && c < 'a'+MaxNVLinkLanes-9:
		return NVLink(int(c-'a') + 10), true
	case c == 'P':
		return LinkPIX, true
	case c == 'B':
		return LinkPXB, true
	case c == 'H':
		return LinkPHB, true
	case c == 'N':
		return LinkNODE, true
	case c == 'S':
		return LinkSYS, true
	}
	return LinkNone, false
}

// EncodeLinkRow returns the links attribute of the GPU at position p: its
// row of the link matrix in the format described at the top of this file.
// It fails rather than truncate when the node's largest GPU index does not
// fit the 64-character attribute.
func EncodeLinkRow(t *Topology, p int) (string, error) {
	if t == nil {
		return "", fmt.Errorf("encode links: nil topology")
	}
	if p < 0 || p >= t.Len() {
		return "", fmt.Errorf("encode links: position %d out of range [0, %d)", p, t.Len())
	}
	maxIndex := 0
	for _, g := range t.GPUs {
		maxIndex = max(maxIndex, g.Index)
	}
	if maxIndex >= maxLinksLen {
		return "", fmt.Errorf("GPU index %d does not fit the %d-character links attribute", maxIndex, maxLinksLen)
	}
	row := make([]byte, maxIndex+1)
	for j := range row {
		row[j] = linkCharAbsent
	}
	for q, g := range t.GPUs {
		if q == p {
			row[g.Index] = linkCharSelf
			continue
		}
		c, err := linkChar(t.Link(p, q))
		if err != nil {
			return "", fmt.Errorf("encode links of GPU%d: to GPU%d: %w", t.GPUs[p].Index, g.Index, err)
		}
		row[g.Index] = c
	}
	return string(row), nil
}

// DecodeLinkRows rebuilds a node's topology from its published devices:
// gpus carry what the caller read from the other attributes (at least
// Index), rows holds each GPU's links attribute keyed by GPU index.
// Positions follow ascending GPU index, as in Parse, whatever order gpus
// comes in. Every row is validated against the GPU list (length, 'X' on
// the GPU's own index, '.' exactly where no GPU exists, known characters)
// and against the other rows (symmetry).
func DecodeLinkRows(gpus []GPU, rows map[int]string) (*Topology, error) {
	if len(gpus) == 0 {
		return nil, fmt.Errorf("decode links: no GPUs")
	}
	if len(gpus) > MaxGPUs {
		return nil, fmt.Errorf("decode links: %d GPUs on one node, at most %d are supported", len(gpus), MaxGPUs)
	}
	sorted := append([]GPU(nil), gpus...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	posOf := make(map[int]int, len(sorted))
	for p, g := range sorted {
		if g.Index < 0 {
			return nil, fmt.Errorf("decode links: GPU index %d is negative", g.Index)
		}
		if g.Index >= maxLinksLen {
			return nil, fmt.Errorf("decode links: GPU index %d does not fit the %d-character links attribute", g.Index, maxLinksLen)
		}
		if _, dup := posOf[g.Index]; dup {
			return nil, fmt.Errorf("decode links: duplicate GPU index %d", g.Index)
		}
		posOf[g.Index] = p
	}
	for idx := range rows {
		if _, ok := posOf[idx]; !ok {
			return nil, fmt.Errorf("decode links: row for GPU index %d, which is not among the node's GPUs", idx)
		}
	}
	width := sorted[len(sorted)-1].Index + 1

	n := len(sorted)
	links := make([][]Link, n)
	for p, g := range sorted {
		row, ok := rows[g.Index]
		if !ok {
			return nil, fmt.Errorf("decode links: GPU %d has no links row", g.Index)
		}
		if len(row) != width {
			return nil, fmt.Errorf("decode links: GPU %d: row %q has %d characters, want %d (largest GPU index %d plus one)",
				g.Index, row, len(row), width, width-1)
		}
		links[p] = make([]Link, n)
		for j := range width {
			c := row[j]
			q, exists := posOf[j]
			switch {
			case j == g.Index:
				if c != linkCharSelf {
					return nil, fmt.Errorf("decode links: GPU %d: character %d is %q, want %q for the GPU itself", g.Index, j, c, linkCharSelf)
				}
			case !exists:
				if c != linkCharAbsent {
					return nil, fmt.Errorf("decode links: GPU %d: character %d is %q, want %q because the node has no GPU %d", g.Index, j, c, linkCharAbsent, j)
				}
			default:
				l, valid := parseLinkChar(c)
				if !valid {
					return nil, fmt.Errorf("decode links: GPU %d: character %d is %q, want a link class (S N H B P 1-9 a-i)", g.Index, j, c)
				}
				links[p][q] = l
			}
		}
	}
	for p := range n {
		for q := p + 1; q < n; q++ {
			if links[p][q] != links[q][p] {
				a, b := sorted[p].Index, sorted[q].Index
				return nil, fmt.Errorf("decode links: asymmetric rows: GPU %d has %q (%s) for GPU %d but GPU %d has %q (%s) for GPU %d",
					a, rows[a][b], links[p][q], b, b, rows[b][a], links[q][p], a)
			}
		}
	}
	t, err := New(sorted, links)
	if err != nil {
		return nil, fmt.Errorf("decode links: %w", err)
	}
	return t, nil
}
