//go:build integration

// Package controller_test runs gpulink's controller in-process against a
// real Kubernetes 1.37 control plane (test/localcluster) with API-only
// nodes whose ResourceSlices are published directly, in the layout the
// kubelet plugin uses, from the topology fixtures in
// driver/topology/testdata. kube-scheduler and the resourceclaim
// controller are the stock ones.
//
//	go test -tags integration ./test/integration/controller/
//	GPULINK_WORKLOAD_GATES=off go test -tags integration -run 'Gang|Job' ./test/integration/controller/
//	go test -tags integration -run '^$' -bench . ./test/integration/controller/
package controller_test

import (
	"os"
	"testing"

	"github.com/gpulink/gpulink/test/localcluster"
)

// cluster is shared by every test and benchmark of the package: starting
// one takes seconds, and each test works in its own namespace and nodes.
var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	// GPULINK_V sets the controller's log verbosity (klog -v).
	localcluster.KlogVerbosityFromEnv()
	var opts localcluster.Options
	if os.Getenv("GPULINK_WORKLOAD_GATES") == "off" {
		// The gang tests then run through gpulink's labels on a cluster
		// without the Workload API.
		opts.FeatureGates = map[string]bool{}
		for gate := range localcluster.WorkloadGates {
			opts.FeatureGates[gate] = false
		}
	}
	os.Exit(localcluster.RunShared(m, "gl-ctrl-", opts, func(c *localcluster.Cluster) { cluster = c }))
}
