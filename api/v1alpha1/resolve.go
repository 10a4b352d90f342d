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
	c := Merge(decoded...)
	c.Default()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("invalid GpuConfig: %w", err)
	}
	return c, nil
}
