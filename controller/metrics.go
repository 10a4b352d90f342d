package controller

import (
	"github.com/prometheus/client_golang/prometheus"
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
	// GPU set ("none" for one GPU, "share" for shares).
	Allocations *prometheus.CounterVec
	// PendingPods is the number of pods waiting for gpulink devices.
	PendingPods prometheus.Gauge
	// Errors counts failures by reason.
	Errors *prometheus.CounterVec
	// Released counts allocations the controller released (unschedulable
	// pods, orphaned claims).
	Released *prometheus.CounterVec
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
	}
	if reg != nil {
		reg.MustRegister(m.AllocationLatency, m.DecisionLatency, m.PlanLatency, m.Allocations, m.PendingPods, m.Errors, m.Released)
	}
	return m
}

// Error reasons.
const (
	errReasonConflict        = "conflict"
	errReasonAPI             = "api"
	errReasonUninterpretable = "uninterpretable"
	errReasonUnsatisfiable   = "unsatisfiable"
	errReasonInventory       = "inventory"
)
