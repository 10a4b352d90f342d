// package planner is gpulink-controller's planning core: what a claim
// asks for, what every node has and holds, and the choice of one node and
// its devices for all of a pod's pending claims. It holds plain data and
// imports no client-go: informers feed it, the controller writes what it
// decides, and its tests and benchmarks build the state directly
// (controller/controllertest). docs/design/controller.md gives the
// reasoning.
//
// # What it owns
//
//   - The state a decision reads: Inventory (each node's GPUs, MIG devices,
//     GPUs partitioned on demand (inventory_ondemand.go) and link matrix,
//     decoded from its slices through internal/sliceformat; other drivers'
//     devices per node, foreign_inventory.go),
//     Ledger (what every claim holds, whoever allocated it, plus the
//     decisions not yet seen by the informers) and FitTracker (the pods
//     counted on each node, for CPU, memory, pods and pod (anti-)affinity).
//   - Claim interpretation: Interpreter turns a ResourceClaim into a Claim
//     (its requests, their alternatives, CEL selectors compiled once by
//     SelectorEvaluator, consumable capacity, GpuConfig layers, requests
//     for other drivers' devices in foreign_claims.go), or says why
//     gpulink cannot allocate it exactly.
//   - The node filter (NodeFilter: node name, exclusions, cordon, node
//     affinity, taints, the node of claims already allocated, node fit).
//   - The choice (Planner.Decide): a pod's claims planned on one node
//     (nodeplan.go, its shares in nodeplan_share.go, nodeplan_mig.go;
//     driver/allocate picks the GPUs within the node), the plans of one
//     pod on several nodes ranked (nodeplan_choose.go,
//     nodeplan_mig_choose.go), and the node chosen among many by the
//     shortcut over kept scores (choice_quick.go), branch and bound for
//     pods with several device sets (choice_bound.go), or planning every
//     admitted node. The request-size mix (sizemix.go) and ranking by
//     stranding (stranding.go) feed the allocator's policy.
//   - What a decision says: Decision, Planner.WaitingMessage and
//     AlternativesNote, the text of the controller's events.
//   - The DeviceClasses gpulink ships (DeviceClasses, SharingLabel,
//     MIGLabel).
//
// # Inputs and outputs
//
// In: a Request (the pod, its pending Claims, its claims already
// allocated, the nodes it was unschedulable on, its Placement). Out: a
// Decision (the chosen Plan: the node and, per claim and request, the
// PlacedResults; the other feasible plans and why nodes did not fit).
//
// # Invariants
//
//   - Decide is a function of its input, the state and the decisions
//     before it (the recent request-size mix), never of the clock or
//     chance. It is not safe for concurrent use: the controller serializes
//     decisions and assumes each one in the Ledger and FitTracker before
//     the next.
//   - The fast paths choose exactly the node and devices that planning
//     every node chooses (TestQuickChoiceMatchesExhaustive,
//     TestBoundChoiceMatchesExhaustive).
//   - No GPU is planned whole for two claims, or whole and in shares; the
//     shares of a GPU stay within its memory and cores.
//
// # Where to start reading
//
// decide.go (Planner.Decide), then claims.go (Claim, Interpreter),
// nodeplan.go (planNode), choice_quick.go and choice_bound.go, ledger.go
// and inventory.go.
package planner
