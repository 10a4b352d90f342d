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
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gpulink/gpulink/test/localcluster"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gl-scale-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err = localcluster.Start(ctx, localcluster.Options{
		Dir: dir,
		// The resourceclaim controller creates every pod's claims and
		// kube-scheduler binds every pod: at their default client rates
		// (20 and 50 per second) they, not gpulink, would set the pace.
		ComponentQPS: 500,
		Logf: func(f string, a ...any) {
			fmt.Fprintf(os.Stderr, "localcluster: "+f+"\n", a...)
		},
	})
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
