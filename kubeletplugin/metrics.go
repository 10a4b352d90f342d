package kubeletplugin

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Operation label values.
const (
	opPrepare   = "prepare"
	opUnprepare = "unprepare"
)

// Metrics are the plugin's Prometheus metrics.
type Metrics struct {
	// ClaimDuration is the time to prepare or unprepare one claim,
	// checkpoint write included.
	ClaimDuration *prometheus.HistogramVec
	// ClaimErrors counts claims whose prepare or unprepare failed.
	ClaimErrors *prometheus.CounterVec
	// PreparedClaims is the number of claims currently prepared.
	PreparedClaims prometheus.Gauge
	// CheckpointCorruptions counts checkpoints found corrupt at startup.
	CheckpointCorruptions prometheus.Counter
	// Publications counts ResourceSlice (re)publications.
	Publications prometheus.Counter
	// BackgroundErrors counts errors reported through HandleError.
	BackgroundErrors prometheus.Counter
	// DeviceHealthy is 1 for a healthy GPU, 0 for one with a fatal
	// condition (tainted), by device name and UUID.
	DeviceHealthy *prometheus.GaugeVec
	// HealthEvents counts health events by device and verdict (fatal,
	// warning, ignored, recovered).
	HealthEvents *prometheus.CounterVec
	// MPSDaemons is the number of MPS control daemons running on the node.
	MPSDaemons prometheus.Gauge
	// PreparedGPUs serves PreparedGPUInfoName (podmetrics.go), from the
	// checkpoint the driver last wrote or read.
	PreparedGPUs *preparedGPUCollector
}

// NodeLabel is the label NewNodeMetrics puts on every series of the
// plugin, naming its node (PreparedGPUInfoName carries it itself).
const NodeLabel = "node"

// NodeMetricsOptions say what the plugin of one node exports.
type NodeMetricsOptions struct {
	// Node names the node: every series carries node="<node>".
	Node string
	// PodMetrics exports PreparedGPUInfoName, which names the namespace,
	// pod and claim of every prepared claim on the node. Off by default:
	// the metrics port has no authentication, and any peer that reaches
	// it would learn every tenant's workload names (--pod-metrics).
	PodMetrics bool
}

// NewNodeMetrics is NewMetrics for the plugin of one node, as the binary
// registers them: every series carries node="<node>". During a DaemonSet
// rolling update two plugin pods of one node are scraped side by side
// (--rolling-update-uid), each reporting the node's state from the shared
// checkpoint, and both watch the node's GPUs' health; the label lets a
// query take one value per node (max by (node)) instead of adding the
// two, whatever labels the scrape puts on the targets (with a pod network
// the two pods do not even share an address). The per-pod info series is
// registered only with o.PodMetrics.
func NewNodeMetrics(reg prometheus.Registerer, o NodeMetricsOptions) *Metrics {
	m := newMetrics()
	perNode := prometheus.WrapRegistererWith(prometheus.Labels{NodeLabel: o.Node}, reg)
	perNode.MustRegister(m.ClaimDuration, m.ClaimErrors, m.PreparedClaims, m.CheckpointCorruptions, m.Publications, m.BackgroundErrors,
		m.DeviceHealthy, m.HealthEvents, m.MPSDaemons)
	if o.PodMetrics {
		reg.MustRegister(m.PreparedGPUs)
	}
	return m
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered, for tests), without the node label of NewNodeMetrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := newMetrics()
	if reg != nil {
		reg.MustRegister(m.ClaimDuration, m.ClaimErrors, m.PreparedClaims, m.CheckpointCorruptions, m.Publications, m.BackgroundErrors,
			m.DeviceHealthy, m.HealthEvents, m.MPSDaemons, m.PreparedGPUs)
	}
	return m
}

func newMetrics() *Metrics {
	m := &Metrics{
		ClaimDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "claim_duration_seconds",
			Help:    "Time to prepare or unprepare one ResourceClaim, checkpoint write included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation"}),
		ClaimErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "claim_errors_total",
			Help: "ResourceClaims whose prepare or unprepare failed.",
		}, []string{"operation"}),
		PreparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "prepared_claims",
			Help: "ResourceClaims currently prepared on this node.",
		}),
		CheckpointCorruptions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "checkpoint_corruptions_total",
			Help: "Corrupt checkpoints found at startup (moved aside, state started fresh).",
		}),
		Publications: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "resourceslice_publications_total",
			Help: "Times the node's ResourceSlices were handed to the publisher.",
		}),
		BackgroundErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "background_errors_total",
			Help: "Errors of background work (ResourceSlice publishing, gRPC servers).",
		}),
		DeviceHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "device_healthy",
			Help: "1 when the GPU is healthy, 0 when it has a fatal condition and is tainted gpu.gpulink.dev/unhealthy.",
		}, []string{"device", "uuid"}),
		HealthEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "health_events_total",
			Help: "GPU health events by verdict: fatal (tainted), warning, ignored (application XIDs), recovered.",
		}, []string{"device", "verdict"}),
		MPSDaemons: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gpulink", Subsystem: "kubeletplugin", Name: "mps_daemons",
			Help: "MPS control daemons running on this node (one per MPS claim).",
		}),
		PreparedGPUs: newPreparedGPUCollector(),
	}
	// Export every series from the start, zero until something happens.
	for _, op := range []string{opPrepare, opUnprepare} {
		m.ClaimErrors.WithLabelValues(op)
		m.ClaimDuration.WithLabelValues(op)
	}
	return m
}
