// Package topology models the GPUs of one node and the link class between
// every two of them, as `nvidia-smi topo -m` and NVML report it.
//
// The model is pure data: no API server, no NVML calls. Everything that
// needs to know how GPUs are wired (the allocator, the kubelet plugin's
// ResourceSlice attributes, the controller's reconstruction of a node from
// those slices) goes through a *Topology, built by New, Parse (from
// `nvidia-smi topo -m` text) or DecodeLinkRows (from published devices).
// A Topology is immutable once built and safe for concurrent readers.
//
// # Positions and indices
//
// GPUs are held in ascending nvidia-smi index order; a GPU's place in that
// order is its position, which is what every method takes and returns.
// Position and index coincide unless a GPU is missing from the node.
//
// # Link classes
//
// Link orders the classes nvidia-smi prints from fastest to slowest:
//
//	NV18 > NV17 > ... > NV1 > PIX > PXB > PHB > NODE > SYS
//
// Any NVLink bond beats any PCIe path, and more bonded lanes beat fewer.
// WeakestLink of a set is the slowest link between two of its members (a
// collective over the set runs at that speed); LinkSum adds the Link values
// of all pairs and ranks sets with the same weakest link.
//
// # NVLink islands
//
// Islands are the connected components of the graph whose edges are NVLink
// bonds. A GPU with no NVLink forms an island of one. Islands are ordered by
// their lowest position and IslandOf gives each position's island ID.
//
// # Aligned groups
//
// For a group size k, AlignedGroups partitions the n GPUs into n/k groups of
// k, leaving n mod k GPUs in no group. The kubelet plugin publishes each
// GPU's group ID as an attribute, so a claim for k GPUs with a
// matchAttribute constraint on it gets a well-connected set from
// kube-scheduler without knowing the topology. The partition is chosen by,
// in order:
//
//  1. the largest minimum, over the groups, of the group's weakest link;
//  2. leximin on the vector of group weakest links sorted from worst to
//     best: after the worst group, the second worst is as good as possible,
//     and so on. Equivalently, the fewest groups whose weakest link is SYS,
//     then the fewest at NODE, and so on up the classes. Leximin rather than
//     "most groups at the best class" because every group is published and
//     each may be handed to a job, so no group should be sacrificed to make
//     another one faster;
//  3. the largest total LinkSum over the groups;
//  4. the lexicographically smallest partition, written as its groups in
//     ascending order, each ascending, concatenated.
//
// The leftover GPUs are part of the choice, so they are the GPUs whose
// exclusion helps the groups most. Nodes of up to 16 GPUs are solved
// exactly by a memoized search over subsets. Larger nodes (up to 64) use a
// deterministic bounded heuristic, greedy best-first construction followed
// by exact or swap-based refinement of every two groups; see solveHeuristic.
// GroupSizes lists the sizes worth publishing for a node.
//
// # The links attribute
//
// EncodeLinkRow writes a GPU's row of the link matrix as one string of at
// most 64 characters, one character per GPU index from 0 to the node's
// largest index ('X' itself, '.' no such GPU, S N H B P for SYS NODE PHB
// PXB PIX, 1-9 and a-i for NV1-NV9 and NV10-NV18), and DecodeLinkRows
// rebuilds and validates the whole matrix from those rows. The format is
// specified in encoding.go.
package topology
