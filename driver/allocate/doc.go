// Package allocate decides which GPUs a request gets: a set of whole GPUs
// on one node, one GPU for a share, or the best node of many. It is pure
// (no API server, no clocks, no randomness), so the controller, the
// `gpulink simulate` command and tests all get the same answer for the
// same input. This comment is the contract; docs/design/allocator.md
// gives the cost model, the search algorithms and the reasoning.
//
// # Inputs and outputs
//
// A NodeState is one node: its topology.Topology (the link of every GPU
// pair), the usage of each GPU (GPUUsage: exclusive, or its shares), its
// share limits and, optionally, the CPU and memory it has left (Host). A
// Request asks for GPUs whole GPUs with at least RequiredLink on every
// pair, or for one share (ShareRequest: memory and cores of one GPU),
// limited to the Eligible GPUs (after CEL selectors and taints). A Policy
// carries the node and GPU strategy (Binpack or Spread), the recent
// request-size mix (SizeMix, kept by a SizeHistory) and the recent pods'
// shapes (DemandMix, kept by a DemandHistory).
//
//   - Allocate(node, req, pol): the GPUs on one node, as a Result.
//   - ChooseNode(nodes, req, pol): the best node and its GPUs; the
//     ranking is a total order of independent per-node scores
//     (ScoreNode, NodeScore.Better), so a caller may keep the scores and
//     rescore only the nodes that changed.
//   - ShareSet: shares of several GPUs as one job; ChooseHost: a node for
//     a pod without GPUs.
//   - NodeState.Commit and Release: record or undo a Result in the usage.
//   - Prepare(topology): precomputes the tables of a node kind (its link
//     matrix); optional, it changes only how long a decision takes.
//
// A request nothing can satisfy returns an *UnsatisfiableError saying why.
//
// # The decision (criteria)
//
// Whole GPUs: among the k-sets S of usable free GPUs whose weakest link
// weak(S) reaches RequiredLink, Allocate takes the best by these
// criteria, each consulted only on a tie in the ones before (the names in
// parentheses are the code's; docs/design/allocator.md defines each):
//
//  1. larger weak(S): a collective runs at its slowest link's speed;
//  2. (3a) the future: the capacity the free GPUs left keep for each
//     request size at the class it can get now, weighted by the size mix;
//  3. (2) larger agg(S), the sum of the set's links;
//  4. (3b, 3c, 3d) finer future tie-breaks: sizes keeping their whole
//     quality, the best set left per size, and the long run (ideal sets
//     broken once the node's current jobs end; under 12 free GPUs);
//  5. (4) larger agg(R) of the GPUs left: the fewest fast links lost;
//  6. (5) lowest positions.
//
// The link class of the request is never traded for the future.
//
// Shares: a GPU that is eligible, not exclusive, with the memory left,
// fewer than MaxSharesPerGPU shares and cores at most 100 after the
// share. Binpack fills GPUs that already hold shares first and opens a
// fresh GPU as a one-GPU whole request would take it; Spread takes the
// least loaded.
//
// # Choosing a node
//
// ChooseNode ranks nodes by criteria 1-2 of each node's best set, then
// the node strategy (binpack: fewer whole GPUs left free), then the tie key
// (NodeState.TieKey: the controller's is the node's place in the
// cluster's topology hierarchy, then its name; else the name).
// With Host and Policy.Demand, binpack first ranks by whether the set is
// on the node's ideal link class, then by the GPU the placement strands
// for the recent pods' CPU, memory and GPU shapes (FGD's fragment
// measure), each shape weighed by how often it is asked for and, in a
// mix from DemandMix.WithScarcity, by how scarce the unallocated GPU is
// that could serve it now (nodes with the GPUs, CPU, memory and GPU
// product it needs left). On a node of a product whose pinned pods ask
// for a larger share of the demand than its share of the unallocated
// GPU (over-demanded), the GPU a placement takes that those pods could
// be fed on counts as stranded for the whole mix (overdemand.go).
//
// # Invariants
//
//   - Deterministic: the same NodeState, Request and Policy give the same
//     Result; weights are integers, so there is no floating-point tie.
//   - Exact up to 16 free GPUs (the tests compare it with brute force on
//     every usage pattern of the 8-GPU topologies and on random mixes);
//     memos and node-kind tables change the time, never the answer
//     (TestKindTablesMatchSearch). Above 16 free GPUs the weakest link is
//     still exact per NVLink component; only components of more than 16
//     free GPUs fall back to a bounded beam search, not guaranteed
//     optimal.
//   - ChooseNode's winner equals Allocate on that node.
//   - TestChurnNeverWorseThanMyopic: over seeded churn workloads the share
//     of multi-GPU requests on their ideal link class is never below a
//     myopic allocator's beyond noise.
//
// # Where to start reading
//
// types.go (the inputs), allocate.go and whole.go (Allocate), tiebreak.go
// and longrun.go (criteria 2-5), exact.go, memo.go and kind.go (the
// search up to 16 free GPUs), large.go and beam.go (beyond), share.go and
// shareset.go (shares), choose.go, score.go and bound.go (ChooseNode),
// mix.go and history.go (size mix), demand.go (demand shapes and mix,
// stranding), host.go (CPU, memory, ChooseHost, DemandHistory). Benchmarks and the
// churn comparisons against first fit, greedy growth, myopic, MAPA and
// the online optimum (the best policy that knows the workload's
// distribution, solved exactly) are in *_test.go (BenchmarkChurn,
// BenchmarkChurnFamilies, online_optimum_test.go;
// docs/performance/churn.md).
//
// See docs/design/allocator.md for the criteria in full (3a-3d and why
// the future comes before the aggregate), the recent size mix, the exact
// search and its stopping rules, node kinds and twin symmetry, nodes of
// more than 16 GPUs, node ranking by branch and bound, and FGD's measure.
package allocate
