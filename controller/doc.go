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
// # Inventory
//
// Every node's topology is rebuilt from its ResourceSlices (pool = node,
// newest complete generation, the "links" attribute decoded with
// topology.DecodeLinkRows). A ledger counts what every claim holds, from
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
// and required affinity, NoSchedule/NoExecute taints, node selectors of
// the pod's already allocated claims, nodes the pod was unschedulable on),
// then place all pending claims of the pod on each candidate node in turn,
// on a copy of its usage: requests in order, firstAvailable alternatives
// in order, devices filtered by the class's and request's CEL selectors
// and by device taints, matchAttribute constraints handled by splitting
// the devices into groups of equal values (best group first, with
// backtracking), shares sized from the capacity request rounded up to the
// device's requestPolicy (else the opaque config's explicit default size,
// else the policy default, else the whole capacity). driver/allocate
// chooses the GPUs within a node. Among nodes that fit, fewer
// firstAvailable fallbacks win, then allocate.ChooseNode ranks them by
// link quality and the packing strategy. The chosen devices are assumed
// in the ledger before the lock is released.
//
// Each decision passes the recent request-size mix (sizemix.go,
// allocate.SizeHistory; --size-mix-window, --size-mix-refresh) as
// allocate.Policy.Mix, so that what is kept free is what is asked for:
// each claim's preferred whole-GPU size counts once, under the decision
// lock, so the mix is a function of the decisions' order.
//
// # Writes
//
// Per claim: the finalizer driver.ClaimFinalizer (a metadata update),
// then status.allocation (results with request, driver, pool, device; for
// shares a new shareID and consumedCapacity; the classes' and claim's
// opaque configs; node selector matchFields metadata.name as
// kube-scheduler writes it; allocationTimestamp) together with the pod in
// reservedFor in one status update. Both carry the resourceVersion read,
// so a concurrent change conflicts instead of being overwritten. Then the
// scheduling gate driver.SchedulingGate is removed with a JSON patch that
// tests the gate's name first, and kube-scheduler binds the pod to the
// node the allocation names.
//
// # Guarantees
//
// Several workers: decisions are serialized by one lock, and every claim
// of a decision is assumed in the ledger before the lock is released. A
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
// for it; a Warning event says so. Claims carrying the finalizer lose
// reservations of pods that are gone or finished (confirmed with a live
// read), are deallocated when no live pod references them, and lose the
// finalizer once neither allocated nor reserved.
//
// # Explaining
//
// Each decision is an event on the pod ("allocated gpus=gpu-0,gpu-1:
// every pair NV2 on node-a", "waiting: no node has 4 free GPUs with every
// pair NVLink (policy Required) (...)"), repeated waiting messages are
// recorded once. Metrics: see Metrics.
package controller
