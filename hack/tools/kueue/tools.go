//go:build tools

// Package tools pins the Kueue manager that hack/kueue.sh builds into
// _output/bin/kueue for the e2e tests that run gpulink under Kueue
// (test/e2e/kueue_*_test.go): quota per DeviceClass (Kueue's DRA support),
// nvidia.com/gpu quota with gpulink's translating webhook, gangs admitted by
// Kueue and placed by gpulink. It is a module of its own so that Kueue's
// dependency tree (its own k8s.io minor, controller-runtime, the
// Kubeflow/Ray/JobSet APIs it integrates with) never enters the driver's
// go.mod. Nothing here is compiled; the blank import only makes
// `go mod tidy` record every dependency in go.mod/go.sum so builds are
// reproducible.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
