package planner

import (
	"fmt"
	"strings"
)

// maxEventNote keeps event notes below the API's 1 KiB limit on
// events.k8s.io/v1 notes, with room for the summary.
const MaxEventNote = 1000

// AlternativesNote tells, after an allocation, which other nodes fit and
// why others did not, so `gpulink explain` can show what was passed over.
// Bounded: three of each, and the whole note within maxEventNote.
func AlternativesNote(chosen *Plan, plans []*Plan, why, skipped []string, unexamined int) string {
	var fit []string
	for _, pl := range plans {
		if pl == chosen || len(pl.Claims) == 0 || len(pl.Claims[0]) == 0 {
			continue
		}
		r := pl.Claims[0][0]
		how := "a share"
		if len(r.MIG) > 0 {
			how = fmt.Sprintf("%d MIG devices", len(r.MIG))
		} else if r.Share == nil {
			how = fmt.Sprintf("%d GPUs", len(r.Positions))
			if len(r.Positions) > 1 {
				how += " weakest link " + r.Weakest.String()
			}
		}
		fit = append(fit, fmt.Sprintf("%s (%s)", pl.Node.Node, how))
	}
	var note string
	if len(fit) > 0 {
		if len(fit) > 3 {
			fit = append(fit[:3], fmt.Sprintf("%d more", len(fit)-3))
		}
		note += "; also fit: " + strings.Join(fit, ", ")
	}
	rejected := append(dedupe(why), skipped...)
	if len(rejected) > 3 {
		rejected = append(rejected[:3], fmt.Sprintf("and %d more", len(rejected)-3))
	}
	if len(rejected) > 0 {
		note += "; passed over: " + strings.Join(rejected, "; ")
	}
	if unexamined > 0 {
		note += fmt.Sprintf("; %d other nodes not planned (they cannot beat this one)", unexamined)
	}
	if len(note) > MaxEventNote/2 {
		note = note[:MaxEventNote/2-3] + "..."
	}
	return note
}

// dedupe keeps the first of equal reasons, in order: many nodes give the
// same one, and an event names each once.
func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
