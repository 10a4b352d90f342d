// Package gang places a gang, the pods of one multi-node job, all or
// nothing, link-minimal across the cluster's NVLink domains and network
// (issue 31, sections 3-4). It is pure (no API server, no clocks, no
// randomness, no client-go): the controller, `gpulink simulate
// --gang-trace` and tests get the same answer for the same input.
//
// # Inputs
//
// A Hierarchy is the cluster's levels, from node labels, tightest first:
// level 0 is one node, levels 1..n the configured label keys (defaults
// DefaultKeys: nvidia.com/gpu.clique, Topograph's
// network.topology.nvidia.com/accelerator, .../leaf, .../spine, and
// topology.kubernetes.io/zone), and level Cluster() every node. Nodes
// sharing a non-empty value of a level's key share that level's domain; a
// node without the label is alone at that level. LevelOfKey maps a
// PodGroup's schedulingConstraints.topology key to a level.
//
// A Request is the gang: its name, Pods (and MinCount, the fewest that
// may be placed), GPUsPerPod, and the level it should stay within with a
// Constraint (None, Preferred or Required), as minLink is for the GPUs of one
// node. Each Node carries its domains (Hierarchy.Domains of its labels),
// Slots, the number of this gang's pods it can take now (computed by the
// caller with the in-node allocator, driver/allocate: link-minimal GPU
// sets inside a node stay its business), and its free and total GPUs.
// With Request.AlignRails, Node.AlignedSlots gives the slots per
// alignment key (such as NIC rail indices) and the gang uses one key on
// every node.
//
// # Output
//
// Place returns a Placement, one node per pod and the level spanned (the
// gang's link class), or an *UnplaceableError whose message says why in
// one line ("gang train-a: 4 pods × 8 GPUs: only 3 fit in one leaf; 2
// leaves would fit under Preferred"), or an error wrapping ErrInvalid
// for input that can never be placed. A Preferred gang placed above its
// level has Relaxed set and a Note in the same style, for an event.
//
// # The decision
//
// Criteria in order, each consulted only on a tie in the ones before:
//
//  1. all or nothing: at least MinCount pods (all Pods when it is 0), more
//     pods first; never more pods on a node than its Slots;
//  2. the lowest level with one domain holding the pods (under Required,
//     at most Request.Level): the gang's slowest link;
//  3. the domain of that level that fits best: fewest slots left after
//     the gang, then fewest free GPUs left (both would be stranded around
//     the gang, or kept whole elsewhere);
//  4. with Request.Demand (the gang shapes asked for lately, with their
//     counts), the domain whose placement keeps the most of that demand
//     placeable: the sum over shapes of the shape's GPUs times the gangs
//     of it that still fit, each in one domain of the shape's own minimal
//     level (the lowest the cluster's total GPUs allow; room counted from
//     the nodes' free GPUs, as their other resources are the caller's),
//     counting no more gangs than were asked for: the domain level's
//     counterpart of the in-node allocator's criterion 2. It comes after
//     best fit because,
//     placed first, it chased the rounding of capacities at the higher
//     levels and gave up tighter fits (measured: fewer gangs placed on
//     the SuperPOD-style replay, docs/performance/gangs.md);
//  5. the busiest enclosing domains, level by level upwards (an idle
//     spine stays idle when a busy one fits as well), then the name;
//  6. inside the domain, level by level down, the last subdomain used is
//     the best fit for the rest; before it, subdomains below the gang's
//     minimal level (the lowest level one domain of the idle cluster could
//     hold it in) are used up largest first (then those with the fewest
//     free GPUs beside): the fewest subdomains, so fewer hops across them
//     for the gang's collectives, freed together when it ends, whole for
//     the gangs after it. Subdomains at or above the minimal level, which
//     a gang spans only where none of them holds it now (relaxed under
//     Preferred, or within a Required level above its minimal one), are
//     used up smallest first: the gang takes the fragments the other jobs
//     left, and the domain closest to holding a gang of its size whole
//     stays so for the next one, which then lands on its minimal level
//     (measured: more gangs on their minimal level under Preferred on the
//     NVL72-style replay, docs/performance/gangs.md).
//
// With AlignRails, criteria 1-4 are compared across alignment keys, then
// the key's name.
//
// # Cost
//
// Linear in the nodes times the levels to group them, plus, with a
// demand, one fill and a pass over the shapes per domain tied on best
// fit. A gang of 64 pods × 8 GPUs on 5,000 nodes:
// BenchmarkPlace (make bench), docs/performance/gangs.md.
//
// # Invariants (tested)
//
//   - Never partial: a Placement has between MinCount and Pods pods, else
//     an error; no node gets more pods than its Slots.
//   - Level-minimal: no placement of as many pods exists at a lower level
//     (checked against brute force on small instances).
//   - Deterministic for a given input.
//
// Measured against per-pod greedy, Kueue TAS, Volcano HyperNode tiers and
// random placement on a gang replay: docs/performance/gangs.md.
package gang
