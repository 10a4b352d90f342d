// Package kubeclient holds what both binaries set on their API clients.
package kubeclient

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// DefaultContentType is the encoding kube-scheduler, the kubelet and
// kube-controller-manager speak to the API server by default
// (--kube-api-content-type). Every object gpulink reads and writes is a
// built-in type, so it can too: lists and watch events of pods, claims and
// ResourceSlices are smaller and cheaper to decode than in JSON, and the
// API server serves them in the encoding its other watchers already use.
// In `make bench-scheduler` (500 nodes) the difference to JSON was within
// the runs' noise; JSON stays available for debugging with a proxy.
const DefaultContentType = runtime.ContentTypeProtobuf

// SetContentType makes cfg's clients send contentType and ask for it,
// falling back to JSON where the API server offers nothing else.
func SetContentType(cfg *rest.Config, contentType string) error {
	switch contentType {
	case runtime.ContentTypeProtobuf:
		cfg.ContentType = runtime.ContentTypeProtobuf
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	case runtime.ContentTypeJSON:
		cfg.ContentType = runtime.ContentTypeJSON
		cfg.AcceptContentTypes = runtime.ContentTypeJSON
	default:
		return fmt.Errorf("--kube-api-content-type %q: want %s or %s", contentType, runtime.ContentTypeProtobuf, runtime.ContentTypeJSON)
	}
	return nil
}
