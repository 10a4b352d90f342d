//go:build integration

// Package compat_test runs the device-plugin translation (the webhook, the
// leader's template maker and garbage collector) and gpulink's controller
// in-process against a real Kubernetes 1.37 control plane
// (test/localcluster): the API server calls the webhook by URL, the stock
// kube-controller-manager creates claims from templates and charges
// ResourceQuota, kube-scheduler binds pods to API-only GPU nodes. It checks
// the multi-tenant guarantees of the translation: quotas keep holding, a
// forged AdmissionReview creates nothing, and a template a namespace user
// pre-creates under a translated name is never used.
//
//	go test -tags integration ./test/integration/compat/
package compat_test

import (
	"os"
	"testing"

	"github.com/gpulink/gpulink/test/localcluster"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	// GPULINK_V sets the log verbosity of the in-process controller (klog -v).
	localcluster.KlogVerbosityFromEnv()
	os.Exit(localcluster.RunShared(m, "gl-compat-", localcluster.Options{}, func(c *localcluster.Cluster) { cluster = c }))
}
