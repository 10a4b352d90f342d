//go:build tools

// Package tools pins the Prometheus server that hack/prometheus.sh builds for
// the e2e test that scrapes gpulink's controller and kubelet plugin and runs
// every query of the Grafana dashboard (test/e2e/prometheus_test.go). It is
// a module of its own so that Prometheus's dependency tree never enters the
// driver's go.mod. Nothing here is compiled; the blank import only makes
// `go mod tidy` record every dependency in go.mod/go.sum so builds are
// reproducible.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
