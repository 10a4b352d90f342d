//go:build integration

// Package scale_test runs gpulink's controller, as its own process, on a
// real Kubernetes 1.37 control plane (test/localcluster) with thousands
// of API-only GPU nodes and pods: TestScale. Its default size is a quick
// run that is part of `make test`; `make scale` is the full one (5,000
// nodes, 10,000 pods; GPULINK_SCALE_NODES, _PODS, _WAVES). Controller
// profiles: GPULINK_SCALE_PROFILE and _PROFILE_SECONDS (see scaleConfig).
//
//	go test -tags integration -run TestScale -v ./test/scale/
package scale_test

import (
	"os"
	"testing"

	"github.com/gpulink/gpulink/test/localcluster"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunShared(m, "gl-scale-", localcluster.Options{
		// The resourceclaim controller creates every pod's claims and
		// kube-scheduler binds every pod: at their default client rates
		// (20 and 50 per second) they, not gpulink, would set the pace.
		ComponentQPS: 500,
		// TestSchedulerSideBySide's profiles of the control plane.
		Profiling: os.Getenv("GPULINK_SCHED_PROFILE_DIR") != "",
	}, func(c *localcluster.Cluster) { cluster = c }))
}
