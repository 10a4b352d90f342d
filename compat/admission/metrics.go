package admission

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts admission outcomes.
type Metrics struct {
	pods     *prometheus.CounterVec
	refused  *prometheus.CounterVec
	inFlight prometheus.Gauge
}

// NewMetrics registers gpulink_compat_pods_total{result},
// gpulink_compat_requests_refused_total{reason} and
// gpulink_compat_requests_in_flight on reg. Results:
// translated, refused (a bad value, or a namespace quota the translation
// would escape, answered with its message) or error (the quotas could not
// be read, or the patch not encoded).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{pods: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpulink_compat_pods_total",
		Help: "Pods with device-plugin GPU resources seen by the translation webhook, by result (translated, refused, error).",
	}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpulink_compat_requests_refused_total",
			Help: "Requests to the translation webhook refused before their body was read, by reason (too-large, in-flight, memory): see the webhook's Limits.",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpulink_compat_requests_in_flight",
			Help: "Requests the translation webhook is serving now, against its MaxInFlight: at the limit, further requests are refused (reason in-flight).",
		})}
	reg.MustRegister(m.pods, m.refused, m.inFlight)
	return m
}

func (m *Metrics) refuse(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

// serving moves the in-flight gauge by delta (+1 as a request takes a
// slot, -1 as it gives it back).
func (m *Metrics) serving(delta float64) {
	if m != nil {
		m.inFlight.Add(delta)
	}
}

func (m *Metrics) count(result string) {
	if m != nil {
		m.pods.WithLabelValues(result).Inc()
	}
}
