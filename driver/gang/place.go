package gang

import (
	"fmt"
	"sort"
)

// Place places every pod of a gang or none: one node per pod, within the
// lowest level it fits (below Request.Level under Required), the domain
// and the nodes in it chosen to keep large domains whole for later gangs
// (doc.go, "The decision"). A gang that does not fit returns an
// *UnplaceableError; invalid input an error wrapping ErrInvalid. Place is
// pure and deterministic: the same input gives the same Placement.
func Place(h *Hierarchy, req Request, nodes []Node) (*Placement, error) {
	if err := validate(h, req, nodes); err != nil {
		return nil, err
	}
	minCount := req.MinCount
	if minCount == 0 {
		minCount = req.Pods
	}
	maxLevel := h.Cluster()
	if req.Constraint == Required {
		maxLevel = req.Level
	}
	var best *choice
	var bestIdx *index
	for _, al := range alignments(req, nodes) {
		ix := newIndex(h, nodes, al, req.AlignRails)
		fut := newFuture(ix, req.Demand)
		for k := req.Pods; k >= minCount; k-- {
			c := ix.best(k, maxLevel, req.GPUsPerPod, fut)
			if c == nil {
				continue
			}
			c.alignment = al
			if best == nil || c.better(best) {
				best, bestIdx = c, ix
			}
			break // more pods first: a smaller k of this alignment cannot win
		}
	}
	if best == nil {
		return nil, unplaceable(h, req, nodes, minCount)
	}
	p := bestIdx.placement(best, req)
	if req.Constraint == Preferred && p.Level > req.Level {
		p.Relaxed = true
		p.Note = relaxedNote(h, req, bestIdx, best, p)
	}
	return p, nil
}

// alignments are the slot counts to try: the nodes' Slots, or with
// AlignRails each alignment key any node offers, in name order.
func alignments(req Request, nodes []Node) []string {
	if !req.AlignRails {
		return []string{""}
	}
	set := map[string]struct{}{}
	for i := range nodes {
		for k := range nodes[i].AlignedSlots {
			set[k] = struct{}{}
		}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// unplaceable explains why no placement of minCount pods exists.
func unplaceable(h *Hierarchy, req Request, nodes []Node, minCount int) error {
	level := h.Cluster()
	if req.Constraint == Required {
		level = req.Level
	}
	e := &UnplaceableError{
		Gang: req.Name, Pods: req.Pods, MinCount: req.MinCount, GPUsPerPod: req.GPUsPerPod,
		Level: level, LevelName: h.Name(level), Constraint: req.Constraint, Plural: h.Plural(level),
	}
	for _, al := range alignments(req, nodes) {
		ix := newIndex(h, nodes, al, req.AlignRails)
		if m := ix.mostIn(level); m > e.MostInOne {
			e.MostInOne = m
		}
		if level == h.Cluster() {
			continue
		}
		c := ix.best(minCount, h.Cluster(), req.GPUsPerPod, nil)
		if c == nil {
			continue
		}
		d := ix.countDomains(c, level)
		if !e.FitsHigher || c.level < e.HigherLevel || (c.level == e.HigherLevel && d < e.HigherDomains) {
			e.FitsHigher, e.HigherLevel, e.HigherDomains = true, c.level, d
		}
	}
	return e
}

// relaxedNote says why a Preferred gang spans more than its level.
func relaxedNote(h *Hierarchy, req Request, ix *index, c *choice, p *Placement) string {
	e := &UnplaceableError{
		Gang: req.Name, Pods: req.Pods, MinCount: req.MinCount, GPUsPerPod: req.GPUsPerPod,
		Level: req.Level, LevelName: h.Name(req.Level), Constraint: req.Constraint,
		MostInOne: ix.mostIn(req.Level),
	}
	where := "of one " + p.LevelName
	if p.Level == h.Cluster() {
		where = "of the cluster"
	}
	return fmt.Sprintf("%s; placed across %d %s %s", e.Error(), ix.countDomains(c, req.Level), h.Plural(req.Level), where)
}
