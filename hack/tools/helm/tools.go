//go:build tools

// Package tools pins the Helm CLI that hack/helm.sh builds to lint and render
// the gpulink chart. It is a module of its own so that Helm's large
// dependency tree (and whatever Kubernetes libraries it is built against)
// never leaks into the driver's go.mod. Nothing here is compiled; the blank
// import only makes `go mod tidy` record every dependency in go.mod/go.sum so
// builds are reproducible.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
