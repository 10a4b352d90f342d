// Package allocate decides which GPUs a request gets: a set of whole GPUs
// on one node, one GPU for a share, or the best node of many. It is pure
// (no API server, no clocks, no randomness) so the controller, the
// `gpulink simulate` command and tests all get the same answer for the
// same input.
//
// # Whole GPUs on one node
//
// A GPU is free when it is not exclusive and holds no shares; a request
// may use the free GPUs that are also eligible (Eligible, or the node's
// entry of EligibleByNode). The link of a pair is a
// topology.Link (larger is faster). For a set S:
//
//	weak(S) = min link over the pairs of S   (none for one GPU)
//	agg(S)  = sum of links over the pairs of S (0 for one GPU)
//
// Allocate picks, among the k-subsets S of the usable GPUs with
// weak(S) >= RequiredLink (always true for k = 1), the one that is best by
// these criteria, each consulted only on a tie in the ones before:
//
//  1. larger weak(S): a collective runs at the speed of its slowest link;
//  2. (3a) the future, weighted by the request-size mix (Policy.Mix, a
//     SizeMix; DefaultSizeMix, sizes 1-8 equally often, when unset). Let R
//     be the free GPUs left after taking S, and for each size j with a
//     weight w_j, 2 <= j <= |R|, let c_j be the weakest link of the best
//     j-subset of all free GPUs: the class a j-GPU request could get now.
//     Score sum_j w_j * cap_j(R), where cap_j(R) is 0 when no j-subset of
//     R reaches c_j any more, and otherwise the number of j-sets the
//     components of R at class c_j hold (GPUs joined by links >= c_j; a
//     component of n GPUs counts n/j), at least 1. Larger is better: the
//     sizes asked for most keep their link class, for as many requests
//     as possible;
//  3. (2) larger agg(S): more fast pairs help all-to-all traffic;
//  4. (3b) the same sum counting only sizes whose best remaining set
//     keeps its whole (weak, agg) quality, then (3c) best_j(R), the best
//     (weak, agg) of a j-subset of R, compared largest j first, then
//     (3d) the long run, on searches over fewer than 12 free GPUs of
//     nodes of at most 16: let U be all the node's GPUs but S (as if every
//     other job had ended) and, for each size j of the mix, I_j the
//     j-sets of the node on its ideal class for j (the best weakest link
//     an idle node gives j GPUs), left out when every j-set is on it or
//     when there are more than 64; score sum_j w_j * 2^20 when U holds a
//     set of I_j, plus w_j * w_j2 for each size j2 when U holds a set of
//     I_j and one of I_j2 with no GPU in common. Larger is better: of two
//     sets equal on the rest, take the one that breaks fewer ideal sets
//     of the sizes asked for, together, once the node's current jobs end
//     (on the DGX-1's NVLink mesh, the end of an NV2 path within a quad,
//     which leaves an NV2 pair, not its middle, which leaves two GPUs with
//     NV2 links into the other quad only);
//  5. (4) larger agg(R): with the rest equal, take the GPUs least
//     connected to the rest. agg(free) = agg(S) + agg(R) + links between
//     S and R, so this minimizes the fast links lost, which prefers GPUs
//     whose group is already partly used;
//  6. (5) lowest positions: compare the ascending position lists.
//
// The numbers in parentheses are the names the code uses. Criterion 3d
// is what the churn families of issue 21 measured a look-ahead to gain
// beyond 3a-3c on meshes (docs/performance/churn.md); where 12 or more
// GPUs are free most of the node is free, the long run is close to now,
// and the memo and the node kinds' tables answer without it. Why the future
// comes before the aggregate: the aggregate differs between almost any
// two sets of one link class on mixed topologies, so when it came first
// (as it did before) the fragmentation criteria were hardly ever
// consulted, and an allocator that ignores the future (best set now,
// lowest positions) could beat gpulink on churn. The link class of the
// request is never traded (criterion 1 first); within it, keeping the
// classes later requests can get is worth more than a denser set now.
// Counting capacity (cap_j), not only whether one j-set survives, is what
// keeps two switch pairs for two pair requests rather than one triple
// when pairs are asked for more often. Weights are integers (parts of
// 2^20), so the decision is exact and deterministic for a given input,
// state and mix; `gpulink simulate` replays it from the scenario's
// sizeMix.
//
// # The recent size mix
//
// A controller passes the mix of the requests it was asked for lately,
// kept by a SizeHistory: the sizes of the last Window whole-GPU requests
// (default 512; each claim counts once, when it is first decided, with
// its preferred alternative; shares and allocationMode All take no fixed
// number of whole GPUs and do not count), plus a pseudo-count of one for
// each size 1..8 so that a size not asked for lately keeps a small weight.
// Old requests leave the window as new ones come, so the mix follows a
// changing workload. The mix the allocator sees is a snapshot taken every
// Refresh requests (default 64): between snapshots decisions share memo
// entries (below), and a mix that moved with every request would make
// each search on a large node cold. The snapshot is a pure function of
// the sequence of requests, and decisions are serialized, so a decision
// stays a function of its input, the cluster state and the requests
// before it. `gpulink simulate` replays it either from the counts the
// controller logs with each new snapshot ("Request size mix", as a
// scenario's sizeMix) or from the scenario's own steps (recentMix).
//
// ChooseNode ranks nodes by the best (weak, agg) a node offers; the set
// Allocate then takes on the winner has that weak link but may give up
// some aggregate to criterion 2.
//
// # Exact search (up to 16 free GPUs)
//
// With f <= 16 free GPUs the search tabulates (weak, agg) for the subsets
// of the free GPUs in one pass over the 2^f masks, O(1) per subset: the
// pairs of a set m with lowest GPUs a < b are the pairs of m\{a}, of
// m\{b} and {a,b}, so weak(m) is a min of three values and agg(m) follows
// by inclusion-exclusion. Subsets larger than both k and the largest
// future size are never consulted and are skipped. The same pass collects
// the candidates, the sets with the best weak link (criterion 1), and
// their aggregates (criterion 3). Criterion 5
// needs agg(R) only, which is agg(free) - (link sums of S's GPUs) +
// agg(S). Criterion 2 scans the submasks of R for each candidate,
// 2^(f-k), and a scan stops once every future size has reached the best
// all free GPUs allow. Candidates are visited by aggregate, then agg(R),
// then positions; the visit stops once the incumbent keeps the most
// capacity any take of k GPUs can leave (for size j at most (f-k)/j
// sets, and no more than all free GPUs hold) and either the next
// candidate has a smaller aggregate or the incumbent keeps every future
// size's best quality, as nothing after it can win then (on uniform
// NVLink nodes, the first candidate; the second stop is not taken when
// criterion 3d is weighed, on fewer than 12 free GPUs). Criterion 3d's
// ideal sets are listed once per node kind (its link matrix; Prepare
// lists them). The result is exact: it equals
// exhaustive enumeration of the objective (the tests check this on every
// usage pattern of the 8-GPU topologies and under random mixes). The
// table is 256 KiB and is kept between searches.
//
// Searches over 12 or more free GPUs (0.1-0.5 ms; idle 16-GPU nodes are
// the slowest) are memoized by everything their answer depends on: the
// links among the free GPUs in their own numbering, the candidates, the
// size, the required link and the mix. Nodes of one kind in one state,
// idle ones above all, share an entry whatever their names, so a cluster
// of idle DGX-2s pays for one search; the memo holds 4,096 answers and is
// emptied when full. An answer from it is the search's answer, so it
// changes only the time a decision takes.
//
// # Node kinds
//
// Nodes of 12 to 16 GPUs are the slowest to search cold (the pass over
// every subset and criterion 3's scans of each candidate's rest), so
// Prepare precomputes, once per node kind (its link matrix; a controller
// calls it when it learns a node's topology), in position numbering: the
// table of every subset's (weak, agg), the best quality of each size
// within every subset (criterion 3's scan becomes a lookup), and, for
// each size, the sets with the best weakest link in visiting order. A
// search on 12 or more free GPUs of a prepared kind then skips the pass:
// on an idle node with every GPU eligible the candidates are the
// precomputed ones; otherwise a depth-first walk over the eligible GPUs,
// cut where a partial set already misses the best weakest link (read
// from the within table), collects them. The walk exploits the node's
// symmetry: two free GPUs are twins when both are eligible or both not
// and they have the same link to every other free GPU; swapping them maps
// the node onto itself, so a set and its image tie on every criterion but
// positions and the one with the lower positions wins. The walk therefore
// only builds sets that take the lowest GPUs of each twin class they use
// (canonical forms): one set per size on an NVSwitch node instead of
// thousands. Position numbering orders sets
// as the local numbering does and every value is the same, so the answer
// is the search's (TestKindTablesMatchSearch compares them over every
// fixture, random topologies, states, sizes, requirements and mixes). A
// 16-GPU kind takes about 5.5 MiB and tens of milliseconds to prepare;
// 16 kinds are kept, the store is emptied when full, and an unprepared
// kind is searched as before.
//
// # More than 16 free GPUs
//
// Every pair of a set whose weakest link is at least c is linked at c or
// better, so the set lies in one connected component of the free GPUs
// joined by links >= c. Going down the link classes present, the first
// class c at which some component with enough usable GPUs holds a set
// with weakest link >= c holds the optimum of criterion 1. Components of
// at most 16 free GPUs (an NVLink island, a PCIe switch, a NUMA node on
// real machines) are searched exactly, with the later criteria applied to
// the component's free GPUs; among components with sets of the same weak
// link the one with the fewest free GPUs wins (best fit: intact islands
// stay intact, the fragmentation criterion coming before the aggregate
// here too), then the aggregate, then lowest positions. So on such nodes
// the answer is exact for criterion 1 and the fragmentation tie-break is
// local to the island.
//
// A component of more than 16 free GPUs (all-NVLink systems beyond 16
// GPUs) is searched by a beam: sets grow one GPU at a time, the 64 best
// partial sets by criteria 1, 2, 5 are kept, with a quota per lowest GPU so
// identical islands all stay represented, and sets that already miss the
// link bound are dropped (adding GPUs never raises weak). Final sets equal
// on 1-2 are compared by criterion 4, then 5. It is deterministic and
// bounded (at most k*64*64 set extensions) but not guaranteed optimal.
//
// # Shares
//
// A share fits a GPU that is eligible, not exclusive, has a known memory
// size, holds fewer than the node's MaxSharesPerGPU shares (default
// DefaultMaxSharesPerGPU), has the memory left, and whose cores stay at
// most 100. Binpack (the default) takes, among GPUs already holding
// shares, the one fullest after placing the share (dominant fraction of
// memory or cores, then least memory left, then lowest position); only
// when none fits does it open a fresh GPU, and then the one a one-GPU
// whole request would take, so shares do not break NVLink pairs either.
// Spread takes the least loaded GPU, fresh ones counting as idle; fresh
// GPUs are again chosen like a one-GPU whole request.
//
// # Choosing a node
//
// ChooseNode ranks nodes that can take the request. Whole GPUs: by
// criteria 1-2 of each node's best set, then the node strategy on the
// whole GPUs the node has free afterwards (binpack: fewer, so that empty
// nodes stay empty for large jobs; spread: more), then node name. A node
// whose best link on every pair could not beat the current leader is not
// searched; the others are scored by a depth-first branch and bound on
// criteria 1-2, which cuts a branch once the best link present on every
// missing pair could not beat the node's best set so far, and stops at a
// set that reaches that bound. Shares, binpack: a GPU that already holds
// shares first, then fewer whole free GPUs left, then the fuller GPU;
// spread: more whole free GPUs left, then the emptier GPU; then node name.
// Only the winning node runs the full tie-break of its set, so the result
// equals Allocate on that node.
//
// # CPU, memory and the pods to come
//
// GPUs are not all a GPU pod needs: a node whose CPU or memory runs out
// keeps its free GPUs idle (stranded). With NodeState.Host (the CPU and
// memory a node has left), Request.Host (what the pod asks besides its
// GPUs) and Policy.Demand (the shapes of the recent GPU pods with their
// CPU and memory, DemandMix from a DemandHistory), ChooseNode skips nodes
// short of the pod's CPU or memory and, under binpack, ranks nodes first
// by (whole GPUs) whether the set is on the node's ideal link class (the
// best weakest link an idle node of its kind gives that size, so the
// link guarantee above is not traded away), then by the GPU the placement
// strands for the demand mix, least first, and only then as above. What
// a shape cannot use on a node is all of the node's unallocated GPU when
// the shape cannot run there (CPU or memory short, too few GPUs with what
// it needs of each), otherwise the rest of each GPU smaller than what it
// needs of one: the fragment measure of FGD (Weng et al., ATC '23),
// weighted by how often the shape was asked for. ChooseHost places pods
// that ask for no GPU by the same measure, on nodes without GPUs first.
// Spread and a nil Demand rank as without.
package allocate
