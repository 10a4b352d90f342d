//go:build tools

// Package tools pins the golangci-lint that hack/lint.sh builds to lint the
// gpulink code. It is a module of its own so that the linters' dependency
// tree never leaks into the driver's go.mod. Nothing here is compiled; the
// blank import only makes `go mod tidy` record every dependency in
// go.mod/go.sum so builds are reproducible.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
