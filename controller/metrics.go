package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpulink/gpulink/controller/steer"
	"github.com/gpulink/gpulink/driver/topology"
)

// Metrics are the controller's Prometheus collectors.
type Metrics struct {
	// AllocationLatency: from the pod's creation to the allocation write.
	AllocationLatency prometheus.Histogram
	// DecisionLatency: planning and writing one pod's claims.
	DecisionLatency prometheus.Histogram
	// PlanLatency: choosing one pod's devices under the decision lock,
	// without waiting for the lock and without API writes.
	PlanLatency prometheus.Histogram
	// Allocations counts allocated requests by the weakest link of their
	// GPU set ("none" for one GPU, "share" for shares, "mig" for MIG
	// devices).
	Allocations *prometheus.CounterVec
	// PendingPods is the number of pods waiting for gpulink devices.
	PendingPods prometheus.Gauge
	// Errors counts failures by reason.
	Errors *prometheus.CounterVec
	// Released counts allocations the controller released (unschedulable
	// pods, orphaned claims, devices of deleted claims once their pods
	// ended).
	Released *prometheus.CounterVec
	// Decisions counts the outcome of every attempt to decide a pod's
	// claims (see the outcome constants).
	Decisions *prometheus.CounterVec
	// GateWait: from the pod's creation to the removal of its scheduling
	// gate by the controller.
	GateWait prometheus.Histogram
	// BelowBestLink counts requests for two or more whole GPUs whose set's
	// weakest link is below the best a k-GPU set of that node has when the
	// node is idle.
	BelowBestLink *prometheus.CounterVec
	// SteerTaintWrites counts the node patches that added or removed the
	// steering taint (controller/steer), by action.
	SteerTaintWrites *prometheus.CounterVec
	// GangsPlaced counts gangs placed (all their pods allocated together),
	// by the hierarchy level they span.
	GangsPlaced *prometheus.CounterVec
	// GangWait: from the creation of a gang's oldest pod to its placement.
	GangWait prometheus.Histogram
	// GangReservations counts starvation reservations made (a gang waited
	// past --gang-starvation-bound and reserved a domain).
	GangReservations prometheus.Counter
	// GangReservedNodes is the number of nodes the current starvation
	// reservation keeps other pods off (0 when none).
	GangReservedNodes prometheus.Gauge

	// inventory reports GPUs, shares and fragmentation per node at scrape
	// time from the controller that SetSource names.
	inventory *inventoryCollector
}

// NewMetrics creates the collectors and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		AllocationLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "allocation_latency_seconds",
			Help:    "Time from pod creation to the allocation of its gpulink claims.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}),
		DecisionLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "decision_duration_seconds",
			Help:    "Time to plan and write the allocation of one pod's gpulink claims.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		PlanLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "plan_duration_seconds",
			Help:    "Time to choose the devices of one pod's gpulink claims under the decision lock (no API writes).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
		Allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "allocations_total",
			Help: "Allocated requests by the weakest link class of their GPU set (none: one GPU, share: a share).",
		}, []string{"weakest_link"}),
		PendingPods: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "pending_pods",
			Help: "Pods waiting for their gpulink claims to be allocated.",
		}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "errors_total",
			Help: "Errors by reason.",
		}, []string{"reason"}),
		Released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "released_allocations_total",
			Help: "Allocations released by the controller, by reason.",
		}, []string{"reason"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "decisions_total",
			Help: "Attempts to decide a pod's gpulink claims, by outcome: allocated (written), waiting (no node fits now; counted per retry), " +
				"invalid (a claim gpulink cannot allocate exactly), not_ready (a claim or DeviceClass is missing, or the cache does not show a release yet), error (a write failed and was rolled back).",
		}, []string{"outcome"}),
		GateWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "gate_wait_seconds",
			Help:    "Time from pod creation until the controller removed the pod's gpulink scheduling gate.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18),
		}),
		BelowBestLink: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "below_best_link_total",
			Help: "Allocated requests of k >= 2 whole GPUs whose weakest link is below the node's best link class for k " +
				"(the weakest link of the set the allocator picks for k GPUs on the idle node), by k and the link class given.",
		}, []string{"size", "weakest_link"}),
		SteerTaintWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "steer_taint_writes_total",
			Help: "Node patches that added or removed one of gpulink's PreferNoSchedule steering taints, by taint key (" + steer.TaintKey + ": --steer-cpu-pods, " +
				steer.ScarceTaintKey + ": --steer-scarce-nodes) and action (add, remove).",
		}, []string{"taint", "action"}),
		GangsPlaced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "gangs_placed_total",
			Help: "Gangs placed, all their pods allocated together, by the hierarchy level they span: node, cluster, or the last segment of a --gang-hierarchy label key (clique, accelerator, leaf, spine, zone by default).",
		}, []string{"level"}),
		GangWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "gang_wait_seconds",
			Help:    "Time from the creation of a gang's oldest pod to the gang's placement.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 20),
		}),
		GangReservations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "gang_reservations_total",
			Help: "Starvation reservations made: a gang waited longer than --gang-starvation-bound and reserved the domain it is closest to fitting in.",
		}),
		GangReservedNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gpulink", Subsystem: "controller", Name: "gang_reserved_nodes",
			Help: "Nodes the current starvation reservation keeps other pods off: while soft, those that fit elsewhere; then every one (0 when no gang holds one).",
		}),
		inventory: newInventoryCollector(),
	}
	// Export the fixed series from the start, zero until something happens,
	// so rates and dashboards work before the first event.
	for _, o := range []string{OutcomeAllocated, OutcomeWaiting, OutcomeInvalid, OutcomeNotReady, OutcomeError, OutcomeHostPlaced} {
		m.Decisions.WithLabelValues(o)
	}
	for _, t := range steer.Taints {
		for _, a := range []string{steerActionAdd, steerActionRemove} {
			m.SteerTaintWrites.WithLabelValues(t.Key, a)
		}
	}
	for _, r := range []string{errReasonConflict, errReasonAPI, errReasonUninterpretable, errReasonUnsatisfiable, errReasonInventory, errReasonBoundElsewhere} {
		m.Errors.WithLabelValues(r)
	}
	for _, r := range []string{releaseReasonRollback, releaseReasonGangRollback, releaseReasonOrphaned, releaseReasonUnschedulable, releaseReasonScheduler} {
		m.Released.WithLabelValues(r)
	}
	// The link classes follow each kind of node (seedLinkSeries).
	for _, l := range []string{topology.LinkNone.String(), weakestLinkShare, weakestLinkMIG} {
		m.Allocations.WithLabelValues(l)
	}
	if reg != nil {
		reg.MustRegister(m.AllocationLatency, m.DecisionLatency, m.PlanLatency, m.Allocations, m.PendingPods, m.Errors, m.Released,
			m.Decisions, m.GateWait, m.BelowBestLink, m.SteerTaintWrites, m.GangsPlaced, m.GangWait, m.GangReservations, m.GangReservedNodes,
			m.inventory, rankingCollector{})
	}
	return m
}

// Decision outcomes (label outcome of gpulink_controller_decisions_total).
const (
	OutcomeAllocated = "allocated"
	OutcomeWaiting   = "waiting"
	OutcomeInvalid   = "invalid"
	OutcomeNotReady  = "not_ready"
	OutcomeError     = "error"
)

// Error reasons.
const (
	errReasonConflict        = "conflict"
	errReasonAPI             = "api"
	errReasonUninterpretable = "uninterpretable"
	errReasonUnsatisfiable   = "unsatisfiable"
	errReasonInventory       = "inventory"
	// errReasonBoundElsewhere: a bound pod's claim is allocated on
	// another node (boundelsewhere.go).
	errReasonBoundElsewhere = "bound_elsewhere"
)

// Release reasons (label reason of
// gpulink_controller_released_allocations_total).
const (
	// releaseReasonRollback: what a failed decision of an unbound pod
	// wrote, rolled back.
	releaseReasonRollback = "rollback"
	// releaseReasonGangRollback: what a gang decision that did not
	// complete wrote, rolled back.
	releaseReasonGangRollback = "gang_rollback"
	// releaseReasonOrphaned: no pod uses the claim any more.
	releaseReasonOrphaned = "orphaned"
	// releaseReasonUnschedulable: kube-scheduler could not place the pod
	// on the allocated node within the grace period.
	releaseReasonUnschedulable = "unschedulable"
	// releaseReasonScheduler: kube-scheduler deallocated the claim.
	releaseReasonScheduler = "scheduler"
)
