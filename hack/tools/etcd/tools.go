//go:build tools

// Package tools pins etcd (the server's main package is the root of module
// go.etcd.io/etcd/server/v3) for the local test cluster built by
// hack/cluster.sh. Nothing here is compiled; the blank import only makes
// `go mod tidy` record the dependencies in go.mod/go.sum.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
