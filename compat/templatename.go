package compat

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// templateHashLen is how many hex digits of the spec's SHA-256 name a
// template: 128 bits, so that nobody can search for another spec with the
// same name (a second preimage), which 64 bits would not rule out.
const templateHashLen = 32

// TemplateName names a translated template by its claim spec, so that pods
// asking for the same thing in one namespace share one template, and so
// that a template whose stored spec does not hash to its name is known not
// to be one the translation made (a namespace user may pre-create any
// template under a gpulink-compat-* name).
//
// The name is computed from the spec as the API server stores it: the
// defaults the API server applies to DeviceRequests are applied to a copy
// first (DefaultClaimSpec), and the spec is encoded canonically (object
// keys sorted, null/empty values dropped, quantities in canonical form),
// so the spec the translation builds and the one read back from the API
// server give the same name.
//
// A ResourceClaimTemplate's spec is immutable (k8s.io/kubernetes v1.37
// pkg/apis/resource/validation ValidateResourceClaimTemplateUpdate:
// ValidateImmutableField on spec), and so is a ResourceClaim's spec, so a
// check made once against a stored object stays true for its lifetime.
func TemplateName(spec resourceapi.ResourceClaimSpec) (string, error) {
	spec = *spec.DeepCopy()
	DefaultClaimSpec(&spec)
	b, err := canonicalJSON(spec)
	if err != nil {
		return "", fmt.Errorf("encoding claim spec: %w", err)
	}
	h := sha256.Sum256(b)
	return TemplatePrefix + hex.EncodeToString(h[:])[:templateHashLen], nil
}

// IsTemplateName says whether name is in the translation's name space
// (TemplatePrefix followed by the hash).
func IsTemplateName(name string) bool {
	return strings.HasPrefix(name, TemplatePrefix)
}

// CheckTemplateName returns an error naming both names when spec does not
// hash to name: the template (or a claim made from it) was not made from
// the spec its name stands for.
func CheckTemplateName(name string, spec resourceapi.ResourceClaimSpec) error {
	want, err := TemplateName(spec)
	if err != nil {
		return err
	}
	if want != name {
		return fmt.Errorf("its spec (%s) hashes to the name %s, not %s", describeSpec(spec), want, name)
	}
	return nil
}

// DefaultClaimSpec applies the defaults the API server applies to the
// device requests of a claim or template spec (k8s.io/kubernetes v1.37
// pkg/apis/resource/v1 defaults.go and zz_generated.defaults.go):
// allocationMode ExactCount, count 1 for ExactCount, toleration operator
// Equal, on exact requests and on firstAvailable subrequests. Nothing else
// in a ResourceClaimSpec is defaulted.
func DefaultClaimSpec(spec *resourceapi.ResourceClaimSpec) {
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if e := r.Exactly; e != nil {
			defaultMode(&e.AllocationMode, &e.Count)
			defaultTolerations(e.Tolerations)
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			defaultMode(&s.AllocationMode, &s.Count)
			defaultTolerations(s.Tolerations)
		}
	}
}

func defaultMode(mode *resourceapi.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourceapi.DeviceAllocationModeExactCount
	}
	if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}

func defaultTolerations(ts []resourceapi.DeviceToleration) {
	for i := range ts {
		if ts[i].Operator == "" {
			ts[i].Operator = resourceapi.DeviceTolerationOpEqual
		}
	}
}

// canonicalJSON encodes v with object keys sorted (encoding/json sorts map
// keys) and without null, empty-array and empty-object members, so that a
// nil and an empty slice (the API server returns either for fields without
// omitempty, such as devices.requests) encode the same.
func canonicalJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, err
	}
	tree, _ = prune(tree)
	return json.Marshal(tree)
}

// prune drops null, empty-array and empty-object members; keep is false
// when v itself is one of those.
func prune(v any) (_ any, keep bool) {
	switch x := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		for k, e := range x {
			if p, ok := prune(e); ok {
				x[k] = p
			} else {
				delete(x, k)
			}
		}
		return x, len(x) > 0
	case []any:
		// Array elements are kept in place (positions matter), pruned
		// inside; an element that prunes away entirely becomes null.
		for i, e := range x {
			p, _ := prune(e)
			x[i] = p
		}
		return x, len(x) > 0
	default:
		return v, true
	}
}

// describeSpec summarizes a claim spec for messages: each request's
// class(es) and count.
func describeSpec(spec resourceapi.ResourceClaimSpec) string {
	var parts []string
	for _, r := range spec.Devices.Requests {
		switch {
		case r.Exactly != nil:
			parts = append(parts, fmt.Sprintf("request %q: %s of %s", r.Name, countOf(r.Exactly.AllocationMode, r.Exactly.Count), r.Exactly.DeviceClassName))
		case len(r.FirstAvailable) > 0:
			var alts []string
			for _, s := range r.FirstAvailable {
				alts = append(alts, fmt.Sprintf("%s of %s", countOf(s.AllocationMode, s.Count), s.DeviceClassName))
			}
			parts = append(parts, fmt.Sprintf("request %q: first of [%s]", r.Name, strings.Join(alts, ", ")))
		default:
			parts = append(parts, fmt.Sprintf("request %q", r.Name))
		}
	}
	if len(parts) == 0 {
		return "no requests"
	}
	return strings.Join(parts, "; ")
}

func countOf(mode resourceapi.DeviceAllocationMode, n int64) string {
	if mode == resourceapi.DeviceAllocationModeAll {
		return "all devices"
	}
	if n == 0 {
		n = 1
	}
	return fmt.Sprintf("%d device(s)", n)
}
