// Package controller allocates gpulink ResourceClaims (driver
// gpu.gpulink.dev) with topology awareness and hands their pods to
// kube-scheduler.
//
// # What is gpulink's
//
// A request is gpulink's when its DeviceClass has CEL selectors that match
// a gpulink device (or a driver-only probe device, so classes work before
// any node publishes). A claim is allocated by the controller when all its
// requests are gpulink's; a claim with no gpulink request is left to
// kube-scheduler; a claim mixing both, or using a feature gpulink cannot
// honour exactly (adminAccess, distinctAttribute, derived attributes,
// non-CEL selectors, capacity names other than memory and cores,
// allocationMode All for a share, invalid opaque config), gets a Warning
// event and stays unallocated. Requests that tolerate the managed device
// taint (driver.ManagedTaintKey) are allocated by the controller too, with
// the same validation (e.g. no share under sharing strategy None): one
// allocator decides every gpulink device, so no two decisions pick the
// same GPU unseen by each other. Only a claim whose requests all tolerate
// the taint, used by a pod that is not gated (no admission policy, or the
// gate removed by someone else), is left to kube-scheduler, which already
// sees that pod; its result is counted once written, and the kubelet
// plugin refuses to prepare it if it breaks the controller's rules or
// over-commits a GPU's memory or cores.
//
// A request is a share of one GPU when its class carries the label
// gpu.gpulink.dev/sharing=true (the shipped gpu-share.gpulink.dev class
// does) or when it asks for capacity; otherwise it gets whole GPUs. See
// DeviceClasses and deployments/deviceclasses/.
//
// A request is for MIG devices when its class carries the label
// gpu.gpulink.dev/mig=true (the shipped mig.gpulink.dev class does, and
// selects the devices with a profile attribute). Its selectors are
// evaluated against the nodes' MIG devices only, every other request's
// against whole GPUs only, so a GPU in MIG mode is never given out whole
// or in shares and a MIG device never to a whole-GPU or share request,
// whatever a class's selectors say. A MIG request asking for capacity, a
// class labelled both MIG and sharing, and a claim that mixes MIG requests
// (or firstAvailable alternatives) with whole-GPU or share ones get a
// Warning event and stay unallocated: MIG devices and GPUs are planned by
// different planners, claim by claim. One pod may have claims of both
// kinds; they are placed on one node.
//
// # Inventory
//
// Every node's topology is rebuilt from its ResourceSlices (pool = node,
// newest complete generation, the "links" attribute decoded with
// topology.DecodeLinkRows). Memory per node is kept low at thousands of
// nodes: the informers drop managedFields and intern the strings slices
// repeat across nodes (transform.go), and the inventory reads devices'
// attributes and capacities from the cached slice's own maps instead of
// copying them. A ledger counts what every claim holds, from
// the claim informer, whoever allocated it: dedicated results (no shareID)
// take the whole device, shares add their consumedCapacity. Allocations
// the controller has decided but the informer has not shown yet are kept
// as assumptions, so informer lag never makes a device look free twice.
// The caches (including each event handler's initial list) are synced
// before the first decision, so a restarted controller counts every
// allocation made before.
//
// # Decisions
//
// Pods are the unit of work. For a pod with pending gpulink claims, under
// one decision lock: filter nodes (exists, schedulable, pod nodeSelector
// and required node affinity, NoSchedule/NoExecute taints, node selectors
// of the pod's already allocated claims, nodes the pod was unschedulable
// on, node fit, pod affinity), then place all pending claims of the pod on each candidate node in turn,
// on a copy of its usage: requests in order, firstAvailable alternatives
// in order, devices filtered by the class's and request's CEL selectors
// and by device taints, matchAttribute constraints handled by splitting
// the devices into groups of equal values (best group first, with
// backtracking), shares sized from the capacity request rounded up to the
// device's requestPolicy (else the opaque config's explicit default size,
// else the policy default, else the whole capacity). driver/allocate
// chooses the GPUs within a node. Among nodes that fit, fewer
// firstAvailable fallbacks win, then allocate.ChooseNode ranks them by
// link quality and the packing strategy; a pod with several placements
// (several claims or requests) is ranked by all of them: the worst link
// of its multi-GPU sets, then the links of all sets by size, their
// aggregate links, the fresh GPUs its shares open, the whole GPUs left
// free, then the node name. The chosen devices are assumed in the ledger
// before the lock is released.
//
// Pods with a single placement (one claim with one request, no
// firstAvailable or matchAttribute, whole GPUs by count or one share: the
// common case) take a shortcut that gives exactly the same node and
// devices (prune.go, quickChoice). allocate.ChooseNode's ranking is a
// total order of independent per-node scores (allocate.ScoreNode), so:
// each node is scored from its usage with the devices the request may not
// use masked (CEL selectors, taints, shareability, one share size,
// memoised per node), nodes without enough GPUs free (whole) or open
// (share) are skipped on usage alone, and the scores are kept per request
// shape and policy (scoreCache, the 32 shapes asked for last) and
// recomputed only for nodes whose usage generation (the ledger counts
// changes per pool) or inventory changed since. The node filter (Node
// object, taints, affinity, node fit) then runs on the nodes best first
// until one passes, and only that one is planned. A decision on 5,000
// nodes thus reads a generation and a kept score per node and filters and
// plans a handful (BenchmarkDecision5000Nodes). It falls back to filtering
// and planning every node when the shortcut cannot vouch for the answer (a
// node whose devices take different share sizes, nodes that disagree on
// the size). When it finds that nothing fits, every node is filtered, so
// that the waiting event counts the nodes per reason as kube-scheduler
// does, and the nodes the filter lets through (all short of devices) are
// planned only until the event has its few distinct reasons (explainNoFit;
// pods with excluded nodes take the full path, which may reset them). The
// allocation event names at most three nodes that also fit, the next-best
// ones, and how many were not planned.
// TestQuickChoiceMatchesExhaustive compares both paths on random clusters.
//
// Pods with several placements (several claims or requests, shares of
// several GPUs; no firstAvailable, no allocationMode All, nodes of at most
// 16 GPUs) are decided by branch and bound (bound.go, boundChoice), again
// exactly as planning every node: each node gets a podScore no plan on it
// can beat (podBound: each request's best set on its own, from the same
// kept scores, and the node's free GPUs), nodes are filtered and planned
// in bound order only until no bound can beat the best plan found
// (TestBoundChoiceMatchesExhaustive). When the requests do not get in each
// other's way on the best nodes, the first node planned is the answer.
//
// Pods whose pending claims ask for MIG devices (allocate_mig.go) are
// filtered as above and planned on every candidate node: requests in
// order, firstAvailable alternatives in order, matchAttribute groups with
// backtracking, count N or allocationMode All (every matching device,
// none in use). A MIG device is one claim's: the ledger counts it as a
// dedicated result. Among the free devices that match, one at a time:
// those on GPUs that already have allocated MIG devices first (pack, so
// idle GPUs keep their large instances), then the smallest placement and
// memory (a request a 1g device satisfies never takes a 3g one), then GPU
// index, placement start and name. Nodes: fewest fallbacks, then most
// devices packed onto busy GPUs, then fewest memory slices, then name. The
// pod's other claims (whole GPUs, shares) are planned on the same node as
// above (planNode, no shortcut), and such a pod's nodes are ranked by them
// (choosePlan). The waiting event names the request's selectors (the profile or
// minimum memory) and whether no device matches them or every match is
// in use. The MIG devices are the ones the kubelet plugin found (static
// MIG); creating instances on demand is not done yet.
//
// Node fit, as kube-scheduler's NodeResourcesFit: the node's allocatable
// pods, cpu, memory, ephemeral-storage, hugepages and extended resources
// minus what the pods counted on it request (k8s.io/component-helpers
// PodRequests: init containers, sidecars, overhead, pod-level resources).
// The sums are kept per node from the pod informer as pods come and go
// (fitTracker), not recomputed per decision. A pod counts on a node once
// bound there, and from its decision on, on the node its claims are
// allocated on (where kube-scheduler must bind it), until it is bound or
// the allocation is released; finished pods do not count. An extended
// resource the node does not advertise but a DeviceClass serves
// (extendedResourceName) is left to kube-scheduler's DRA plugin. Pod
// affinity: required pod affinity and anti-affinity terms of the pod, and
// required anti-affinity terms of the pods already counted, over any
// topology key (a term is matched against the counted pods' labels and
// namespaces, and its domains are the nodes' values of the key). Not
// evaluated, left to kube-scheduler and the unschedulable release below:
// terms with a non-empty namespaceSelector, preferred terms, host ports,
// volumes, topology spread constraints, and pods that kube-scheduler
// assumed or nominated but that are not bound or decided by gpulink.
// When nothing fits, the waiting event counts which filter rejected how
// many nodes, as kube-scheduler's message does ("waiting: 0/12 nodes: 5
// Insufficient cpu, 4 no 4 free GPUs with every pair NVLink, 3 node(s) had
// untolerated taint(s) (node a: ...)").
//
// Each decision passes the recent request-size mix (sizemix.go,
// allocate.SizeHistory; --size-mix-window, --size-mix-refresh) as
// allocate.Policy.Mix, so that what is kept free is what is asked for:
// each claim's preferred whole-GPU size counts once, under the decision
// lock, so the mix is a function of the decisions' order.
//
// With --rank-by-stranding (stranding.go) a decision also passes each
// node's CPU and memory left, the pod's own and the shapes of the pods
// decided recently (allocate.DemandHistory, as allocate.Policy.Demand):
// pods with one device set are ranked by the GPU their placement strands
// for those shapes before link quality and packing (FGD's measure; see
// docs/performance/trace.md).
//
// # Writes
//
// Per claim: status.allocation (results with request, driver, pool,
// device; for shares a new shareID and consumedCapacity; the classes' and
// claim's opaque configs; node selector matchFields metadata.name as
// kube-scheduler writes it; allocationTimestamp) together with the pod in
// reservedFor in one status update; per pod, the scheduling gate
// driver.SchedulingGate is removed with a JSON patch that tests the gate's
// name first, and kube-scheduler binds the pod to the node the allocation
// names. The claim must carry the finalizer driver.ClaimFinalizer before
// it is allocated: the chart's MutatingAdmissionPolicy (claimFinalizer)
// puts it on claims naming a gpulink DeviceClass at creation, so an
// allocation is two writes (status, gate); where the claim lacks it (no
// policy, a class the policy does not know, or the garbage collection
// below took it from a claim no pod used yet), the controller adds it
// first with a metadata update, three writes. Every write carries the
// resourceVersion read, so a concurrent change conflicts instead of being
// overwritten. A claim with the finalizer that the controller will never
// allocate (no gpulink request after all, or no live pod uses or owns it)
// loses the finalizer.
//
// Deleted claims in use: the finalizer keeps a deleted claim, and the GPUs
// it counts, until no pod reserves it; the chart's claim-finalizer-guard
// ValidatingAdmissionPolicy refuses its removal by anyone else while
// reservedFor is not empty. Where a claim goes anyway (no policy, a cluster
// admin), its devices stay counted while a pod of its last seen
// reservedFor exists, is bound and has not finished: in the ledger at
// once, and in a hold record (a claim in Config.HoldNamespace whose
// allocation repeats the devices) that kube-scheduler and a restarted
// controller count too; see holds.go, which also says what a restart
// cannot recover.
//
// Pipelining: decisions are serialized under one lock, but the writes are
// issued after it is released, by the worker that decided (Config.Workers
// workers, 32 in the binary): while one worker writes its pod's claims and
// gate, the others decide and write theirs. The ledger's assumptions keep
// the devices of a decision taken until the informer shows its write, and
// the fit tracker counts the pod on its node from the decision on.
//
// # Guarantees
//
// Several workers: decisions are serialized by one lock, and every claim
// of a decision is assumed in the ledger (and the pod in the node fit)
// before the lock is released; the writes of different pods then run in
// parallel in their workers. A
// claim read from the cache before the lock is checked again under it; a
// claim another pod decided meanwhile (assumed, or allocated as the
// informer shows it) is not decided again: the ledger refuses a second
// assumption for a claim, so one decision can never hide another's
// devices. Pods sharing a claim: the claim is decided once, by the first
// pod; the others wait for its update and are handed to kube-scheduler
// with that allocation (which reserves them).
//
// Pods with several claims: the claims are decided together on one node
// and written in order. When a write fails (HTTP 429, conflict, timeout,
// anything), the assumptions not written are dropped and the claims this
// decision already wrote are rolled back, as kube-scheduler's Unreserve
// does: their reservation for the pod is removed, and their allocation
// and finalizer too unless another pod reserved the claim meanwhile (a
// claim changed by anyone else is left alone). A rollback that cannot be
// written is retried before the pod is decided again, so an unbound pod
// never waits holding part of its devices. A write that failed without an
// answer from the API server (a timeout, a broken connection) may have been
// applied: a live read tells, and an applied one is counted in the ledger
// and rolled back with the others instead of being forgotten while it
// holds devices. The pod is retried with the work queue's backoff; other
// pods sharing its claims are queued again.
//
// Two allocators: kube-scheduler allocates a gpulink device only for a
// tolerating claim of an ungated pod (see above). Such a decision is
// invisible to the controller until written, so a whole GPU and a share
// can still meet on one device in that case; the kubelet plugin's
// conflict check (whole GPUs exclusive, shares within memory and cores)
// then fails the second prepare instead of over-committing the GPU.
// With the chart's admission policy every pod is gated and this cannot
// happen.
//
// Invariants, checked by the churn tests (controllertest.CheckInvariants):
// no GPU held whole by two claims or whole and in shares, shares of one
// GPU within its memory and cores, and no allocation, reservation or
// finalizer left once the pods are gone.
//
// Memory: the per-node memos of selector results and share sizes are
// LRU-bounded (memoEntriesPerNode entries each); compiled CEL programs,
// class probes and resolved configs are bounded caches too.
//
// # Recovery
//
// Pods whose claims are all allocated lose the gate (the controller may
// have stopped before ungating). Gated pods without gpulink claims lose it
// too. A pod that stays unbound with PodScheduled=False/Unschedulable for
// longer than the grace period after its allocation has its claims
// released (reservedFor first, then the allocation) and the node excluded
// for it; a Warning event says so. Excluded nodes (also those of an
// allocation kube-scheduler deallocated) are recorded on the pod in the
// annotation ExcludedNodesAnnotation (before the release, when the
// controller releases), read back by a restarted controller, and cleared
// when every node was excluded and the pod starts over. Claims carrying the finalizer lose
// reservations of pods that are gone or finished (confirmed with a live
// read), are deallocated when no live pod references them, and lose the
// finalizer once neither allocated nor reserved, unless they are
// gpulink's and a live pod uses or owns them (the finalizer the admission
// policy put on a claim about to be allocated).
//
// # Explaining
//
// Each decision is an event on the pod ("allocated gpus=gpu-0,gpu-1:
// every pair NV2 on node-a", "waiting: 0/3 nodes: 2 no 4 free GPUs with
// every pair NVLink (policy Required), 1 Insufficient cpu (...)"),
// repeated waiting messages are recorded once. The allocation event also names the nodes that fit too
// (with the first request's weakest link) and why others were passed over,
// three of each at most; `gpulink explain POD` shows it with the claims.
//
// # Metrics
//
// NewMetrics registers, under gpulink_controller_:
//
//   - decisions_total{outcome}: attempts to decide a pod's claims, by
//     outcome: allocated, waiting (no node fits; one per retry, so a
//     waiting pod counts again on every cluster change), invalid (a claim
//     gpulink cannot allocate exactly), not_ready (a claim or DeviceClass
//     missing), error (a write failed and the decision was rolled back).
//   - decision_duration_seconds: planning and writing one pod's claims;
//     allocation_latency_seconds: pod creation to the allocation write;
//     gate_wait_seconds: pod creation to the removal of the scheduling
//     gate by the controller (all histograms).
//   - allocations_total{weakest_link}, errors_total{reason},
//     released_allocations_total{reason}, pending_pods.
//   - below_best_link_total{size,weakest_link}: requests of k >= 2 whole
//     GPUs whose set's weakest link is below the node's best for k, the
//     weakest link of the set driver/allocate picks for k GPUs on the idle
//     node (computed once per node inventory).
//
// Per node, computed when Prometheus scrapes (a custom collector over the
// inventory and the ledger, nothing on the decision path):
//
//   - gpus{node,product,state}: state allocated (held whole), shared
//     (holds shares), free (neither, and no NoSchedule/NoExecute device
//     taint but gpulink's managed one), tainted (neither, but such a taint).
//   - shares{node,product}, share_memory_bytes{node,product},
//     gpu_memory_bytes{node,product}.
//   - fragmented_gpus{node,size}: for each size k of topology.GroupSizes
//     (2, 4, 8, ... below the node's GPU count), the free GPUs that belong
//     to no set of k free GPUs whose every pair is linked at c(g, k), where
//     c(g, k) is the best class a k-set containing GPU g has on the idle
//     node. An idle node has 0; every stranded GPU lost the best k-set it
//     could be part of to allocations (or a taint). Free means as in gpus.
//     The search (fragmentation.go) finds cliques of the "linked at >= c"
//     graph exhaustively, so the figure is exact; it is bounded by
//     fragmentSearchBudget set extensions per node and size (a few hundred
//     suffice for 16 GPUs) and the series is left out when that runs out.
//     The figure is cached per node until its inventory or free GPUs
//     change, so a scrape costs one pass over the devices otherwise.
//
// deployments/grafana/gpulink.json is a dashboard of these and the kubelet
// plugin's metrics; its test checks every query against NewMetrics.
//
// # Pods written for device plugins
//
// Pods asking for nvidia.com/gpu, HAMi's nvidia.com/gpumem / gpucores /
// gpumem-percentage, aliyun.com/gpu or tencent.com/vcuda-core /
// vcuda-memory in their container limits are translated at admission by
// a mutating webhook that this binary serves on every replica
// (compat/admission, --webhook-address): each asking container gets a
// claim from a ResourceClaimTemplate per request shape, the extended
// resources are removed, and the pod is gated. From then on the pod is
// like any other: the same allocator, events, inspect view, CDI
// preparation and MPS limits. Two routes were weighed:
//
//   - DRA extended resources (KEP-5004, DeviceClass.spec.extendedResourceName,
//     GA and locked on in 1.37): kube-scheduler serves the name from the
//     class by building a "special" claim in its own allocator
//     (pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go:
//     one ExactCount request of the class per container and resource, no
//     tolerations, no capacity) and creates it in PreBind. gpulink's devices
//     carry the managed-by-controller NoSchedule taint, which that request
//     does not tolerate, so kube-scheduler would never find a device; the
//     controller would have to impersonate kube-scheduler's special claim
//     and pod.status.extendedResourceClaimStatus for every such pod, a
//     contract that is kube-scheduler's own. And 1.37 maps only device
//     counts: memory and core names (gpumem, gpucores, vcuda-memory) have
//     no mapping until KEP-6406 (alpha in 1.38).
//   - Admission translation (chosen): plain claims, so memory and cores,
//     link-minimal sets, HAMi's GPU-type annotations (as CEL selectors) and
//     every existing guarantee apply unchanged; the cost is a webhook on
//     the pod-creation path, confined by matchConditions to pods that ask
//     for the configured names, and templates to garbage-collect (the
//     leader deletes unreferenced ones after a grace period; the claims
//     themselves are owned by the pods).
//
// The admission policy that gates pods with claims runs before webhooks
// and is not reinvoked, so the translation adds the gate itself.
package controller
