package v1alpha1

import (
	"fmt"
	"slices"
)

// Normalize decodes, defaults and validates a single configuration, as a
// DeviceClass's (no claim layer to restrict).
func Normalize(raw []byte) (*GpuConfig, error) {
	return Resolve([][]byte{raw}, nil)
}

// Resolve turns the configuration layers that apply to one request into
// the effective configuration. class holds the DeviceClass's layers (the
// cluster operator's), claim the claim's (the user's), each in order. Each
// layer is decoded, the claim's are checked against the class's (see
// CheckClaimNarrows), they are merged in order, and only then defaulted and
// validated, so defaults of a later layer never mask an earlier layer's
// explicit setting. No layers yields the defaults.
func Resolve(class, claim [][]byte) (*GpuConfig, error) {
	decodedClass, err := DecodeLayers(class...)
	if err != nil {
		return nil, fmt.Errorf("DeviceClass configuration: %w", err)
	}
	decodedClaim, err := DecodeLayers(claim...)
	if err != nil {
		return nil, fmt.Errorf("claim configuration: %w", err)
	}
	resolved, _, err := ResolveDecoded(decodedClass, decodedClaim)
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

// ResolveDecoded is Resolve for layers the caller has already decoded:
// class holds the DeviceClass's, claim the claim's. A claim layer that
// widens what the class allows is refused (CheckClaimNarrows). It also
// returns the merged layers before defaulting, for callers that need to
// know which fields were set explicitly (a share size from the config
// beats the device's default; a defaulted one does not), so nobody has to
// decode the same bytes twice.
func ResolveDecoded(class, claim []*GpuConfig) (resolved, explicit *GpuConfig, err error) {
	if err := CheckClaimNarrows(class, claim); err != nil {
		return nil, nil, err
	}
	explicit = Merge(slices.Concat(class, claim)...)
	resolved = explicit.DeepCopy()
	resolved.Default()
	if err := resolved.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid GpuConfig: %w", err)
	}
	return resolved, explicit, nil
}
