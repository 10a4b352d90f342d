package controller

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/controller/gangs"
)

// Where a gang's further pods go.
//
// A gang with pods placed already (bound, or handed to kube-scheduler
// with their claims allocated) sometimes has more to place: replacements
// for pods it lost (decideGang with fewer than minCount to place), a pod
// beyond minCount (syncPod), a refused pod placed again (replaceGangPod).
// Its link class is the highest level it spans, so these go as close to
// the placed pods as they fit: into the domains the placed pods share,
// tightest first (their node, clique, leaf, ...), not wherever a fresh
// placement of the new pods alone would fit best.
//
//   - Required: up to the domain of the Required level, and no further:
//     where even that has no room, the pods wait.
//   - Preferred, or no level: up to the widest labelled domain they
//     share, then anywhere. A pod that ends up above a Preferred level
//     gets a GangLevelRelaxed event, as a gang placed above it does.

// homeStep is one domain to try: its level and nodes (nil: anywhere).
type homeStep struct {
	level int
	nodes []string
}

// gangHome is where a gang's placed pods are and the domains to try for
// its further pods, tightest first. No steps: the pods go anywhere, as a
// fresh gang's do (nothing placed, or the placed pods share no domain of
// a Required level).
type gangHome struct {
	ref    string
	placed int
	steps  []homeStep
	// level is the gang's Required or Preferred level (-1: none); required
	// tells which.
	level    int
	required bool
	// sharedAt[lv] is the value of level lv (a label level) all placed
	// pods' nodes share, "" when they share none; node is their node when
	// they are all on one.
	sharedAt []string
	node     string
	// rail is the NIC rail key the placed pods of a gang with
	// gang-rails: aligned use ("": any rails).
	rail string
}

// spreadAt tells whether the placed pods are known to span more than one
// domain of level lv (more than one node at level 0).
func (h gangHome) spreadAt(lv int) bool {
	if lv == 0 {
		return h.node == ""
	}
	return lv > 0 && lv < len(h.sharedAt) && h.sharedAt[lv] == ""
}

// within returns step i's nodes as a set (nil: anywhere).
func (h gangHome) within(i int) sets.Set[string] {
	if i < 0 || i >= len(h.steps) || h.steps[i].nodes == nil {
		return nil
	}
	return sets.New(h.steps[i].nodes...)
}

// tryOrder is the steps to try, at least one: anywhere when there are none.
func (h gangHome) tryOrder(top int) []homeStep {
	if len(h.steps) == 0 {
		return []homeStep{{level: top}}
	}
	return h.steps
}

// span is the level the gang spans with its placed pods and pods on
// nodes (the hierarchy's top: the cluster).
func (h gangHome) span(c *Controller, nodes []string) int {
	top := c.hierarchy.Cluster()
	if h.placed == 0 || len(h.sharedAt) < top {
		return top
	}
	if h.node != "" && !slices.ContainsFunc(nodes, func(n string) bool { return n != h.node }) {
		return 0
	}
	domains := make([][]string, 0, len(nodes))
	for _, n := range nodes {
		obj, err := c.nodes.Get(n)
		if err != nil {
			return top
		}
		domains = append(domains, c.nodeDomains(obj, c.inv.Node(n)))
	}
	for lv := 1; lv < top; lv++ {
		v := h.sharedAt[lv]
		if v != "" && !slices.ContainsFunc(domains, func(d []string) bool { return d[lv-1] != v }) {
			return lv
		}
	}
	return top
}

// placedNote is what a placement event adds for pods placed near the
// gang's placed ones at step i, spanning span with them: which domain
// they joined, or that none had room.
func (h gangHome) placedNote(c *Controller, i, span int) string {
	if h.placed == 0 || len(h.steps) == 0 || i < 0 {
		return ""
	}
	st := h.steps[i]
	switch {
	case st.nodes != nil:
		return fmt.Sprintf("; within the %s its %d pods placed before share", c.hierarchy.Name(st.level), h.placed)
	case i == 0:
		// The placed pods share no domain: there was none to join.
		return ""
	}
	return fmt.Sprintf("; no room in the %s its %d pods placed before share, so with them the gang spans a %s",
		c.hierarchy.Name(h.steps[i-1].level), h.placed, c.hierarchy.Name(span))
}

// relaxedNote is the GangLevelRelaxed event for pods that, with the
// gang's placed ones, span more than its Preferred level; "" when they
// do not.
func (h gangHome) relaxedNote(c *Controller, span int) string {
	if h.required || h.level < 0 || h.placed == 0 || span <= h.level {
		return ""
	}
	why := fmt.Sprintf("no %s they share had room", c.hierarchy.Name(h.level))
	if h.spreadAt(h.level) {
		why = fmt.Sprintf("they span more than one %s already", c.hierarchy.Name(h.level))
	}
	return fmt.Sprintf("%s: prefers one %s; with its %d pods placed before, these span a %s: %s",
		h.ref, c.hierarchy.Name(h.level), h.placed, c.hierarchy.Name(span), why)
}

// gangHome finds where the gang's placed pods are and the domains to try
// for its further pods.
func (c *Controller) gangHome(ctx context.Context, spec gangs.Spec, members []*gangMember) gangHome {
	h := gangHome{ref: spec.String(), level: -1}
	if spec.Level != "" {
		level, ok := c.hierarchy.LevelOfKey(spec.Level)
		if !ok {
			level, ok = c.hierarchy.LevelOfName(spec.Level)
		}
		if !ok {
			return h
		}
		h.level = level
	}
	top := c.hierarchy.Cluster()
	// A Required level of the whole cluster requires nothing: its
	// further pods try the placed pods' domains, then anywhere.
	h.required = spec.Policy == gangs.Required && h.level >= 0 && h.level < top
	placed := c.placedNodes(ctx, members)
	if len(placed) == 0 {
		return h
	}
	h.placed = len(placed)
	if spec.AlignRails {
		h.rail = c.placedRailKey(ctx, members)
	}
	maxLevel := top - 1
	if h.required {
		maxLevel = h.level
	}
	h.sharedAt = make([]string, top)
	h.node = placed[0]
	for k, n := range placed {
		if n != h.node {
			h.node = ""
		}
		obj, err := c.nodes.Get(n)
		if err != nil {
			// A placed pod's node is gone: where the gang is is unknown,
			// and its further pods go anywhere (keeping its rails).
			return gangHome{ref: h.ref, level: h.level, required: h.required, rail: h.rail}
		}
		d := c.nodeDomains(obj, c.inv.Node(n))
		for lv := 1; lv <= maxLevel; lv++ {
			switch {
			case k == 0:
				h.sharedAt[lv] = d[lv-1]
			case h.sharedAt[lv] != d[lv-1]:
				h.sharedAt[lv] = ""
			}
		}
	}
	domain := make([][]string, maxLevel+1)
	for _, n := range c.inv.All() {
		obj, err := c.nodes.Get(n.Node)
		if err != nil {
			continue
		}
		d := c.nodeDomains(obj, n)
		for lv := 1; lv <= maxLevel; lv++ {
			if v := h.sharedAt[lv]; v != "" && d[lv-1] == v {
				domain[lv] = append(domain[lv], n.Node)
			}
		}
	}
	if h.node != "" && c.inv.Node(h.node) != nil {
		domain[0] = []string{h.node}
	}
	for lv := 0; lv <= maxLevel; lv++ {
		if len(domain[lv]) == 0 {
			continue
		}
		if n := len(h.steps); n > 0 && len(h.steps[n-1].nodes) == len(domain[lv]) {
			// The same nodes as the tighter domain (nested labels): one try.
			h.steps[n-1].level = lv
			continue
		}
		h.steps = append(h.steps, homeStep{level: lv, nodes: domain[lv]})
	}
	if h.required && (len(h.steps) == 0 || h.steps[len(h.steps)-1].level != h.level) {
		// They share no domain of the Required level: nothing to keep to.
		h.steps = nil
		return h
	}
	if !h.required {
		h.steps = append(h.steps, homeStep{level: top})
	}
	return h
}

// placedNodes are the nodes of the gang's placed pods: bound, or handed to
// kube-scheduler with their claims allocated (not bound yet: their node is
// where the claims are).
func (c *Controller) placedNodes(ctx context.Context, members []*gangMember) []string {
	var out []string
	for _, m := range members {
		node := m.pod.Spec.NodeName
		if node == "" {
			if !m.gated() && len(m.pc.ours) == 0 {
				m.pc = c.collectClaims(ctx, m.pod)
			}
			for _, ic := range m.pc.ours {
				if n := allocatedNode(ic.Claim); n != "" {
					node = n
					break
				}
			}
		}
		if node != "" {
			out = append(out, node)
		}
	}
	return out
}

// homeWhere says where home's steps let a pod go, for an event: "within
// the leaf its gang's placed pods share (72 nodes)" under Required, else
// the tightest domain first and what comes after it.
func (c *Controller) homeWhere(h gangHome) string {
	if len(h.steps) == 0 {
		return "anywhere"
	}
	last := h.steps[len(h.steps)-1]
	if h.required {
		return fmt.Sprintf("within the %s its gang's placed pods share (%d nodes)", c.hierarchy.Name(last.level), len(last.nodes))
	}
	first := h.steps[0]
	if first.nodes == nil {
		return "anywhere"
	}
	return fmt.Sprintf("as close to its gang's placed pods as it fits: the %s they share (%d nodes) first, then wider", c.hierarchy.Name(first.level), len(first.nodes))
}
