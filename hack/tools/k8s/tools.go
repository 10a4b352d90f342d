//go:build tools

// Package tools pins the Kubernetes programs hack/cluster.sh builds for the
// local test cluster. Nothing here is compiled; the blank imports only make
// `go mod tidy` record every dependency in go.mod and go.sum so that builds
// are reproducible. etcd and containerd live in sibling modules
// (hack/tools/etcd, hack/tools/containerd) because their dependency graphs
// conflict with Kubernetes' (containerd v2.2.1 does not compile against the
// github.com/containerd/containerd/api Kubernetes v1.37.1 requires, and
// Kubernetes requires etcd v3.7).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
