package planner

import (
	"fmt"
	"strings"

	"github.com/gpulink/gpulink/driver/topology"
)

// How a claim's alternatives read in events and notes.

// describe renders an alternative for events: "4 free GPUs with every pair NV1
// or better (policy Required)", "a share of 8Gi memory, 30% cores".
func (a *Alternative) describe() string {
	var b strings.Builder
	if a.MIG {
		return a.describeMIG()
	}
	switch {
	case a.Share:
		if a.Count > 1 {
			fmt.Fprintf(&b, "%d shares on distinct GPUs", a.Count)
		} else {
			b.WriteString("a share")
		}
		var parts []string
		if q, ok := a.Capacity[capMemory]; ok {
			parts = append(parts, q.String()+" memory")
		}
		if q, ok := a.Capacity[capCores]; ok {
			parts = append(parts, q.String()+"% cores")
		}
		if len(parts) > 0 {
			b.WriteString(" of " + strings.Join(parts, ", "))
		}
	default:
		b.WriteString(a.countOf("GPU"))
	}
	if a.RequiredLink != topology.LinkNone && !a.Share {
		if a.RequiredLink == topology.LinkNVLink {
			b.WriteString(" with every pair NVLink (policy Required)")
		} else {
			fmt.Fprintf(&b, " with every pair %s or better (policy Required)", a.RequiredLink)
		}
	}
	if len(a.Selectors) > len(a.Class.Spec.Selectors) {
		b.WriteString(" matching the request's selectors")
	}
	return b.String()
}

// describeMIG renders a MIG alternative for events, naming the request's
// own selectors (the profile or memory it asks for): "1 free MIG device
// matching device.attributes["gpu.gpulink.dev"].profile == "1g.10gb"".
func (a *Alternative) describeMIG() string {
	var b strings.Builder
	b.WriteString(a.countOf("MIG device"))
	if own := a.Selectors[len(a.Class.Spec.Selectors):]; len(own) > 0 {
		b.WriteString(" matching " + a.migSelectors())
	}
	return b.String()
}

// migSelectors names what a MIG alternative selects: the request's own
// selectors (a profile, a minimum memory), else its class's.
func (a *Alternative) migSelectors() string {
	if own := a.Selectors[len(a.Class.Spec.Selectors):]; len(own) > 0 {
		return strings.Join(own, " && ")
	}
	return "DeviceClass " + a.Class.Name
}

// wantedDevices names what the pending claims ask for ("4 free GPUs with
// every pair NVLink plus a share of 4Gi memory").
func wantedDevices(pending []*Claim) string {
	var wants []string
	for _, ic := range pending {
		for _, r := range ic.Requests {
			if len(r.Alternatives) > 0 {
				wants = append(wants, r.Alternatives[0].describe())
			}
		}
		for _, fr := range ic.Foreign {
			wants = append(wants, fr.describe())
		}
	}
	return strings.Join(wants, " plus ")
}

// countOf says how many devices (noun, singular) the alternative asks
// for: "all matching GPUs of a node", "1 free GPU", "4 free GPUs".
func (a *Alternative) countOf(noun string) string {
	switch {
	case a.All:
		return "all matching " + noun + "s of a node"
	case a.Count == 1:
		return "1 free " + noun
	}
	return fmt.Sprintf("%d free %ss", a.Count, noun)
}
