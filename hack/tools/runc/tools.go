//go:build tools

// Package tools pins the runc that hack/gpu-check.sh builds into the GPU
// acceptance suite's bundle. Nothing here is compiled; the blank import
// only makes `go mod tidy` record every dependency in go.mod/go.sum so
// builds are reproducible.
package tools

import (
	_ "github.com/opencontainers/runc"
)
