package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// Link is the class of the connection between two GPUs. Larger values are
// faster, so "better" comparisons are plain integer comparisons and the
// weakest link of a set is a min over its pairs.
//
// The order follows the legend `nvidia-smi topo -m` prints: any NVLink bond
// beats any PCIe path, and more bonded lanes beat fewer.
type Link uint8

const (
	// LinkNone means "no link known": the zero value, never a real pair.
	LinkNone Link = iota
	// LinkSYS traverses PCIe and the SMP interconnect between NUMA nodes.
	LinkSYS
	// LinkNODE traverses PCIe and the interconnect between host bridges of one NUMA node.
	LinkNODE
	// LinkPHB traverses PCIe and a PCIe host bridge (typically the CPU).
	LinkPHB
	// LinkPXB traverses multiple PCIe bridges without the host bridge.
	LinkPXB
	// LinkPIX traverses at most a single PCIe bridge.
	LinkPIX
	// linkNVBase is the value below NV1; NV<n> is linkNVBase+n.
	linkNVBase
)

// MaxNVLinkLanes is the largest bond nvidia-smi reports today (NV18 on H100 SXM).
const MaxNVLinkLanes = 18

// LinkNVLink is the weakest NVLink class (NV1). As a required minimum it
// means "every pair connected by NVLink, any lane count".
const LinkNVLink = linkNVBase + 1

// NVLink returns the class of a bond of the given number of NVLink lanes.
func NVLink(lanes int) Link {
	if lanes < 1 {
		lanes = 1
	}
	if lanes > MaxNVLinkLanes {
		lanes = MaxNVLinkLanes
	}
	return linkNVBase + Link(lanes)
}

// Valid reports whether l is a real link class: a PCIe path or an NVLink
// bond of 1 to MaxNVLinkLanes lanes (not LinkNone).
func (l Link) Valid() bool {
	return (l >= LinkSYS && l <= LinkPIX) || (l > linkNVBase && l <= linkNVBase+MaxNVLinkLanes)
}

// IsNVLink reports whether the link is an NVLink bond.
func (l Link) IsNVLink() bool { return l > linkNVBase }

// Lanes returns the number of bonded NVLink lanes, 0 for PCIe paths.
func (l Link) Lanes() int {
	if !l.IsNVLink() {
		return 0
	}
	return int(l - linkNVBase)
}

func (l Link) String() string {
	switch {
	case l.IsNVLink():
		return "NV" + strconv.Itoa(l.Lanes())
	case l == LinkPIX:
		return "PIX"
	case l == LinkPXB:
		return "PXB"
	case l == LinkPHB:
		return "PHB"
	case l == LinkNODE:
		return "NODE"
	case l == LinkSYS:
		return "SYS"
	default:
		return "none"
	}
}

// ParseLink parses one cell of `nvidia-smi topo -m`: NV<n>, PIX, PXB, PHB,
// NODE or SYS. "SOC" is the pre-2018 spelling of SYS and is accepted.
func ParseLink(token string) (Link, error) {
	t := strings.ToUpper(strings.TrimSpace(token))
	switch t {
	case "PIX":
		return LinkPIX, nil
	case "PXB":
		return LinkPXB, nil
	case "PHB":
		return LinkPHB, nil
	case "NODE":
		return LinkNODE, nil
	case "SYS", "SOC":
		return LinkSYS, nil
	}
	if rest, ok := strings.CutPrefix(t, "NV"); ok {
		n, err := strconv.Atoi(rest)
		if err == nil && n >= 1 && n <= MaxNVLinkLanes {
			return NVLink(n), nil
		}
	}
	return LinkNone, fmt.Errorf("unknown link class %q (want NV1..NV%d, PIX, PXB, PHB, NODE or SYS)", token, MaxNVLinkLanes)
}

// ParseLinkClass parses a link class as users write it in policies: the
// tokens ParseLink accepts plus "NVLink", meaning any NVLink bond (NV1).
func ParseLinkClass(s string) (Link, error) {
	if strings.EqualFold(strings.TrimSpace(s), "NVLink") {
		return LinkNVLink, nil
	}
	l, err := ParseLink(s)
	if err != nil {
		return LinkNone, fmt.Errorf("unknown link class %q (want NVLink, NV1..NV%d, PIX, PXB, PHB, NODE or SYS)", s, MaxNVLinkLanes)
	}
	return l, nil
}
