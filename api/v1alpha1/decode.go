package v1alpha1

import (
	"bytes"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	"github.com/gpulink/gpulink/internal/yamldoc"
)

// strictCodec decodes YAML or JSON (YAML being a superset), rejecting unknown
// fields with their full path, duplicate keys and case-mismatched keys. It
// is built once: the scheme and serializer are safe for concurrent use.
var strictCodec = func() *json.Serializer {
	scheme := runtime.NewScheme()
	utilruntime.Must(AddToScheme(scheme))
	return json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
}()

// Decode parses one GpuConfig from JSON or YAML. apiVersion and kind must be
// exactly gpu.gpulink.dev/v1alpha1 and GpuConfig, and every field must be
// known. It neither defaults nor validates values; see Normalize.
func Decode(raw []byte) (*GpuConfig, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("decoding GpuConfig: empty document")
	}
	if err := yamldoc.SingleDocument(raw); err != nil {
		return nil, fmt.Errorf("decoding GpuConfig: %w", err)
	}
	if err := precheck(raw); err != nil {
		return nil, fmt.Errorf("decoding GpuConfig: %w", err)
	}
	into := &GpuConfig{}
	obj, _, err := strictCodec.Decode(raw, nil, into)
	if err != nil {
		return nil, fmt.Errorf("decoding GpuConfig: %w", err)
	}
	cfg, ok := obj.(*GpuConfig)
	if !ok {
		// Unreachable while precheck admits only our kind, but a wrong
		// type here must not turn into a nil dereference later.
		return nil, fmt.Errorf("decoding GpuConfig: decoder returned %T", obj)
	}
	return cfg, nil
}
