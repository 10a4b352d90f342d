// Package controller is gpulink-controller: it allocates the
// ResourceClaims of driver gpu.gpulink.dev with topology awareness and
// hands their pods to kube-scheduler. This comment is the contract;
// docs/design/controller.md gives the reasoning and the details.
//
// # What it owns
//
// The informers on claims, pods, ResourceSlices, DeviceClasses and Nodes;
// the work queues of pods and claims; keeping the planning state current
// from the informers (package controller/planner owns the inventory, the
// ledger, the node fit and the choice of a node and devices for all of a
// pod's pending claims; driver/allocate chooses the GPUs within a node);
// the API writes and their rollback; claim garbage collection and
// the finalizer; events, metrics, leader election and the server of the
// device-plugin translation webhook (compat/admission).
//
// # Inputs and outputs
//
// In: pods held behind the scheduling gate driver.SchedulingGate (the
// chart's admission policy adds it to pods with resource claims; a pod
// that another controller's gate still holds, Kueue's admission gate say,
// waits until that gate is gone: othergates.go), their
// claims, DeviceClasses, the kubelet plugins' slices, Nodes and the pods
// already on them (for node fit). A request is gpulink's when its class
// selects gpulink devices; a share when its class has SharingLabel or it
// asks for capacity; MIG devices when its class has MIGLabel. A claim
// with gpulink requests is allocated here (also when they tolerate the
// managed device taint), with its requests for other drivers' devices
// (RDMA NICs under the GPUs' PCIe root, say) chosen by kube-scheduler's
// rules; a claim with none is left to kube-scheduler; a claim asking for
// what gpulink cannot honour exactly (adminAccess, distinctAttribute,
// non-CEL selectors, allocationMode All on other drivers' devices, ...)
// gets a Warning event naming the field and stays unallocated. Other
// drivers' ResourceSlices feed the inventory too.
//
// Out, per pod: for each claim one status update with status.allocation
// and the pod in reservedFor (after adding driver.ClaimFinalizer when the
// admission policy did not), then the scheduling gate removed with a JSON
// patch; kube-scheduler binds the pod to the node the allocation names.
// Each decision is an event on the pod (report.ReasonAllocated and the other
// report.Reason constants): the devices and their weakest link, the nodes that
// also fit, or, when nothing fits, how many nodes each filter rejected.
// `gpulink explain` shows it. Metrics: NewMetrics (gpulink_controller_*).
//
// # Invariants
//
//   - One allocator for every gpulink device: decisions are serialized
//     under one lock, and a decision's devices are assumed in the ledger
//     (and its pod in the node fit) before the lock is released, so
//     informer lag never makes a device look free twice; a claim is
//     decided once, by the first pod that uses it. Writes run after the
//     lock, in parallel workers.
//   - No GPU is held whole by two claims, or whole and in shares; the
//     shares of a GPU stay within its memory and cores; no allocation,
//     reservation or finalizer is left once the pods are gone
//     (controllertest.CheckInvariants, run by the churn tests).
//   - The fast paths (scores kept per request shape, branch and bound for
//     pods with several placements) choose exactly the node and devices
//     that planning every node chooses (TestQuickChoiceMatchesExhaustive,
//     TestBoundChoiceMatchesExhaustive).
//   - Every write carries the resourceVersion read. A write that landed
//     (also one whose response was lost) stands: a decision whose writes
//     all landed is complete. When one write of an unbound pod's decision
//     definitely fails, the claims already written for it are rolled back
//     (as kube-scheduler's Unreserve), so an unbound pod never waits
//     holding part of its devices. A claim released here is decided
//     from the cache again only once the informer shows the release
//     (claimversions.go): a retry that took the stale copy for allocated
//     would remove the pod's gate with that claim unallocated.
//   - A bound pod's claims stay allocated on its node: the controller
//     reserves a claim only for a pod already bound, leaves every other
//     reservation to kube-scheduler's PreBind (written against the
//     claim's resourceVersion), and never releases a claim reserved for a
//     live pod; rollbacks and releases of unreserved claims carry the
//     resourceVersion, so they and a binding cannot both succeed.
//   - A decision is a function of its input, the cluster state and the
//     decisions before it (the recent request-size mix, Config.Mix),
//     never of the clock or chance.
//   - The pods of a gang are decided together: every pod's claims are
//     assumed before any is written, and written before any gate is
//     removed; nothing is held while a gang waits, and a decision left
//     half written by a previous run is rolled back (or, when complete,
//     finished).
//   - A restarted controller syncs every cache first and so counts every
//     allocation made before; pods it had allocated but not ungated lose
//     the gate; a pod left unschedulable on its node past the grace period
//     has its claims released and the node excluded for it
//     (ExcludedNodesAnnotation).
//
// A tolerating claim of a pod that is not gated is kube-scheduler's to
// allocate; its result is counted once written, and the kubelet plugin's
// prepare-time check refuses an over-commit. With the chart's admission
// policy every pod is gated, so this happens only once kube-scheduler has
// refused a pod on the node of its allocation and the claim was
// deallocated (its PostFilter) or released (checkUnschedulable).
//
// # Where to start reading
//
// controller.go: Config, New, Run, the workers. handlers.go: the
// informers' event handlers. gang.go, gang_decide.go, gang_write.go,
// gang_reserve.go: gangs (pods of a PodGroup or gang label,
// controller/gangs) placed all or nothing with driver/gang, their
// recovery after a restart and the starvation policy; gang_clique.go,
// gang_computedomain.go, gang_rails.go: the clique level from the GPUs'
// published clique, ComputeDomain gangs kept in one clique, NIC rails
// aligned across a gang's pods. reconcile.go: one
// pod from the queue to its writes (syncPod), asking
// planner.Planner.Decide for the node and devices under the decision
// lock. write.go, status.go, gate.go, rollback.go: the writes and their
// rollback (unreserve). gc.go, holds.go, exclude.go, dealloc.go: claims
// without pods, deleted claims in use, released nodes. mpsusers.go: the
// MPS one-user checks
// against the pod cache. metrics.go, metrics_inventory.go: the metrics.
// Package planner (controller/planner) is the planning core without
// client code; package report (controller/report) holds what users read
// back: the per-node report `gpulink inspect` prints and the event
// reasons `gpulink explain` reads, so the CLI does not link the
// controller. Tests build a fake cluster with harness_test.go; fixtures
// shared with other packages are in controllertest.
//
// See docs/design/controller.md for the reasoning: which claims are
// gpulink's and why, the shortcut and branch-and-bound choices, MIG
// placement, node fit and pod affinity, the size mix and
// --rank-by-stranding, --place-cpu-pods (pods without GPU claims placed
// by a preferred node, cpupods.go and docs/cpu-pods.md), the writes and
// rollback, deleted claims in use,
// recovery, the metrics' definitions, and why device-plugin pods are
// translated at admission rather than through DRA extended resources.
package controller
