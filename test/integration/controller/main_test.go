//go:build integration

// Package controller_test runs gpulink's controller in-process against a
// real Kubernetes 1.37 control plane (test/localcluster) with API-only
// nodes whose ResourceSlices are published directly, in the layout the
// kubelet plugin uses, from the topology fixtures in
// driver/topology/testdata. kube-scheduler and the resourceclaim
// controller are the stock ones.
//
//	go test -tags integration ./test/integration/controller/
//	go test -tags integration -run '^$' -bench . ./test/integration/controller/
package controller_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/test/localcluster"
)

// cluster is shared by every test and benchmark of the package: starting
// one takes seconds, and each test works in its own namespace and nodes.
var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	// GPULINK_V sets the controller's log verbosity (klog -v).
	fs := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(fs)
	if v := os.Getenv("GPULINK_V"); v != "" {
		_ = fs.Set("v", v)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gl-ctrl-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err = localcluster.Start(ctx, localcluster.Options{Dir: dir, Logf: func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "localcluster: "+f+"\n", a...)
	}})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting local cluster: %v\n", err)
		return 1
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping local cluster: %v\n", err)
		}
	}()
	return m.Run()
}
