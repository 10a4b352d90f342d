//go:build tools

// Package tools pins containerd v2 (daemon, runc shim, ctr) for the local
// test cluster built by hack/cluster.sh. Nothing here is compiled; the blank
// imports only make `go mod tidy` record the dependencies in go.mod/go.sum.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
