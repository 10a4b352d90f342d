package report

// Reasons of the events the controller records (events/v1 reason), which
// `gpulink explain` reads.
const (
	ReasonAllocated       = "GPUsAllocated"
	ReasonWaiting         = "WaitingForGPUs"
	ReasonUninterpretable = "ClaimNotAllocatable"
	ReasonReleased        = "AllocationReleased"
	ReasonGateRemoved     = "SchedulingGateRemoved"
	ReasonAllocateFailed  = "AllocationFailed"
	// ReasonSliceIgnored is recorded on a ResourceSlice the controller
	// refuses to use because its pool is named after another node.
	ReasonSliceIgnored = "ResourceSliceIgnored"
	// ReasonClaimDeletedInUse is recorded on a pod whose claim was deleted
	// while the pod may still use its GPUs.
	ReasonClaimDeletedInUse = "ClaimDeletedInUse"
	// ReasonMPSUsersDiffer is recorded on a pod kept gated because its
	// containers would be clients of an MPS server with containers of
	// another user.
	ReasonMPSUsersDiffer = "MPSUsersDiffer"
	// ReasonPriorityScope is recorded on a pod whose claim has an MPS share
	// with a task priority (sharing.priority, HAMi's nvidia.com/priority),
	// to say what that priority can order: a Warning when the share's GPU
	// already carries shares of other claims, which it cannot be ordered
	// against.
	ReasonPriorityScope = "PriorityScope"
	// ReasonGangWaiting is recorded on every gated pod of a gang that
	// cannot be placed yet, naming why (too few pods, or what fits where).
	ReasonGangWaiting = "GangWaiting"
	// ReasonGangPlaced is recorded on every pod of a gang placed all at
	// once: its node, the gang's level and domain.
	ReasonGangPlaced = "GangPlaced"
	// ReasonGangRelaxed is a Warning on every pod of a gang whose
	// Preferred level could not be met: it spans a higher level.
	ReasonGangRelaxed = "GangLevelRelaxed"
	// ReasonGangRolledBack is recorded on the pods of a gang whose
	// decision was interrupted (a controller restart or failover) before
	// every pod was allocated: what was written is released.
	ReasonGangRolledBack = "GangRolledBack"
	// ReasonGangReserved is recorded on the pods of a gang that waited
	// longer than the starvation bound and now reserves a domain.
	ReasonGangReserved = "GangReservedDomain"
	// ReasonGangPodReplaced is recorded on a pod of a gang that
	// kube-scheduler refused after it was ungated, when the controller
	// places it again on its own within its gang's domain.
	ReasonGangPodReplaced = "GangPodReplaced"
	// ReasonSelectorsCostly is recorded on a pod whose claims' CEL
	// selectors took longer than one attempt may spend evaluating them
	// on the cluster's devices (outside the decision lock); the evaluation
	// goes on at the next attempt.
	ReasonSelectorsCostly = "SelectorsCostly"
	// ReasonBoundElsewhere is a Warning on a bound pod whose claim is
	// allocated on another node: the pod cannot start and must be
	// created again.
	ReasonBoundElsewhere = "ClaimOnOtherNode"
)
