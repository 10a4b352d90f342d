package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// restRequests counts the controller's API requests by result, under the
// name and labels client-go's own adapter (component-base) uses, so the
// API load one controller puts on the server can be read from its
// /metrics (the scale test does).
type restRequests struct{ c *prometheus.CounterVec }

func (r restRequests) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

// registerRESTMetrics hooks client-go's request results into reg. Call it
// once, before the first client is created.
func registerRESTMetrics(reg prometheus.Registerer) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "Number of HTTP requests to the API server, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"})
	reg.MustRegister(c)
	clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: restRequests{c}})
}
