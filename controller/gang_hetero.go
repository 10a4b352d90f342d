package controller

import "github.com/gpulink/gpulink/controller/planner"

// Gangs whose pods differ.
//
// The gang's slots on each node are counted by planning one pod's claims
// there again and again (trialSlots), so all pods are planned by one
// representative's. A gang's pods usually come from one pod template;
// when they do not (a launcher with fewer GPUs than its workers, say),
// the representative is the pod asking for the most whole GPUs (the
// first such by name, one with host ports before one without): each slot then holds the largest pod, so a smaller
// one fits where the placement puts it, at the cost of packing the
// smaller pods less tightly than they could be. Pods whose claims differ
// in other ways (NICs, shares, selectors) still get the waiting event
// that names the pod that did not fit where the placement put it. A pod
// with host ports counts one slot per node (two copies would take one
// port); preferring it among equals keeps a launcher without ports from
// counting its workers' slots as several per node.

// gangRepresentative is the ready pod whose claims count the gang's slots:
// the one asking for the most whole GPUs, then one with host ports, the
// first by name among equals.
func gangRepresentative(ready []*gangMember) *gangMember {
	rep, most, ports := ready[0], planner.WholeGPUs(ready[0].pending), planner.HasHostPorts(ready[0].pod)
	for _, m := range ready[1:] {
		g := planner.WholeGPUs(m.pending)
		if g < most || (g == most && (ports || !planner.HasHostPorts(m.pod))) {
			continue
		}
		rep, most, ports = m, g, planner.HasHostPorts(m.pod)
	}
	return rep
}
