//go:build integration

// Package chartpolicies_test checks the gpulink chart against a real
// Kubernetes 1.37 API server (test/localcluster, no gpulink process): it
// installs the rendered chart and then
//   - dry-runs every rendering of hack/helm.sh and the kind demo's
//     examples on the server (its full validation: schemas, CEL
//     compilation, RBAC rule checks);
//   - creates pods and claims and checks what the MutatingAdmissionPolicies
//     did to their scheduling gates and finalizers;
//   - writes ResourceSlices with a token of the kubelet plugin's service
//     account bound to a pod on node-a, and checks that the
//     ValidatingAdmissionPolicy and the ClusterRole let through exactly the
//     slices of driver gpu.gpulink.dev on node-a;
//   - checks what the controller's RBAC grants it and that its pod policy
//     lets it lift its own gate and nothing else.
//
// The cluster is the package's own: the chart's policies are bound
// cluster-wide.
//
//	go test -tags integration ./test/integration/chartpolicies/
package chartpolicies_test

import (
	"os"
	"testing"

	"github.com/gpulink/gpulink/test/localcluster"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(localcluster.RunShared(m, "gl-chart-", localcluster.Options{}, func(c *localcluster.Cluster) { cluster = c }))
}
