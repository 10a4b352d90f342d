package v1alpha1

import (
	"fmt"
)

// Normalize decodes, defaults and validates a single configuration.
func Normalize(raw []byte) (*GpuConfig, error) {
	return Resolve(raw)
}

// Resolve turns the configuration layers that apply to one request (the
// DeviceClass's first, then the claim's) into the effective configuration:
// each is decoded, they are merged in order, and only then defaulted and
// validated, so defaults of a later layer never mask an earlier layer's
// explicit setting. No layers yields the defaults.
func Resolve(layers ...[]byte) (*GpuConfig, error) {
	decoded, err := DecodeLayers(layers...)
	if err != nil {
		return nil, err
	}
	resolved, _, err := ResolveDecoded(decoded...)
	return resolved, err
}

// DecodeLayers strictly decodes each configuration layer; an error names
// the layer's position when there is more than one.
func DecodeLayers(layers ...[]byte) ([]*GpuConfig, error) {
	decoded := make([]*GpuConfig, 0, len(layers))
	for i, raw := range layers {
		c, err := Decode(raw)
		if err != nil {
			if len(layers) > 1 {
				return nil, fmt.Errorf("configuration layer %d: %w", i, err)
			}
			return nil, err
		}
		decoded = append(decoded, c)
	}
	return decoded, nil
}

// ResolveDecoded is Resolve for layers the caller has already decoded. It
// also returns the merged layers before defaulting, for callers that need
// to know which fields a user set explicitly (a share size from the config
// beats the device's default; a defaulted one does not), so nobody has to
// decode the same bytes twice.
func ResolveDecoded(decoded ...*GpuConfig) (resolved, explicit *GpuConfig, err error) {
	explicit = Merge(decoded...)
	resolved = explicit.DeepCopy()
	resolved.Default()
	if err := resolved.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid GpuConfig: %w", err)
	}
	return resolved, explicit, nil
}
