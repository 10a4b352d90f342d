//go:build integration

// Package monitoring_test checks the chart's monitoring objects against
// the real APIs they are written for, on a real Kubernetes 1.37 API server
// (test/localcluster): the ServiceMonitor against the Prometheus
// Operator's own CustomResourceDefinition.
//
//	go test -tags integration ./test/integration/monitoring/
package monitoring_test

import (
	"os"
	"testing"

	"github.com/gpulink/gpulink/test/localcluster"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunShared(m, "gl-mon-", localcluster.Options{}, func(c *localcluster.Cluster) { cluster = c }))
}
