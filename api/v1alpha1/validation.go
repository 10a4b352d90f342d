package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpulink/gpulink/driver/topology"
)

// maxSharesPerGPULimit follows from cores being whole percentages: beyond
// 100 shares some share would get less than 1% of the SMs.
const maxSharesPerGPULimit = 100

// priorityRange says which priorities exist, for error messages.
const priorityRange = "must be 0 (high) or 1 (low)"

// mpsModeValues says which MPS modes exist, for error messages.
const mpsModeValues = `must be "Isolated" or "Concurrent"`

// MaxMemoryOvercommitPercent bounds SharingConfig.MemoryOvercommitPercent.
const MaxMemoryOvercommitPercent = 400

var (
	supportedPolicies   = []TopologyPolicy{TopologyBestEffort, TopologyRequired}
	supportedStrategies = []SharingStrategy{SharingMPS, SharingHAMiCore, SharingNone}
	supportedMPSModes   = []MPSMode{MPSIsolated, MPSConcurrent}
)

// Validate checks every field and returns all problems at once as an
// aggregate of field errors (nil if none). Empty policy and strategy are
// accepted as "the default", so Validate works before and after Default.
func (c *GpuConfig) Validate() error {
	if c == nil {
		return field.ErrorList{field.Required(field.NewPath(Kind), "configuration is missing")}.ToAggregate()
	}
	var errs field.ErrorList
	errs = append(errs, validateTopology(c.Topology, field.NewPath("topology"))...)
	errs = append(errs, validateSharing(c.Sharing, field.NewPath("sharing"))...)
	errs = append(errs, validatePlacement(c.Placement, field.NewPath("placement"))...)
	return errs.ToAggregate()
}

var supportedPlacements = []PlacementStrategy{PlacementBinpack, PlacementSpread}

func validatePlacement(p *PlacementConfig, path *field.Path) field.ErrorList {
	if p == nil {
		return nil
	}
	var errs field.ErrorList
	for _, f := range []struct {
		name string
		v    PlacementStrategy
	}{{"node", p.Node}, {"gpu", p.GPU}} {
		switch f.v {
		case "", PlacementBinpack, PlacementSpread:
		default:
			errs = append(errs, field.NotSupported(path.Child(f.name), f.v, supportedPlacements))
		}
	}
	return errs
}

func validateTopology(t *TopologyConfig, path *field.Path) field.ErrorList {
	if t == nil {
		return nil
	}
	var errs field.ErrorList
	switch t.Policy {
	case "", TopologyBestEffort, TopologyRequired:
	default:
		errs = append(errs, field.NotSupported(path.Child("policy"), t.Policy, supportedPolicies))
	}
	minLink := path.Child("minLink")
	if t.MinLink == "" {
		if t.Policy == TopologyRequired {
			errs = append(errs, field.Required(minLink, "policy Required needs the slowest acceptable link class"))
		}
	} else if _, err := topology.ParseLinkClass(t.MinLink); err != nil {
		errs = append(errs, field.Invalid(minLink, t.MinLink, err.Error()))
	}
	return errs
}

func validateSharing(s *SharingConfig, path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	var errs field.ErrorList
	switch s.Strategy {
	case "", SharingMPS, SharingHAMiCore, SharingNone:
	default:
		errs = append(errs, field.NotSupported(path.Child("strategy"), s.Strategy, supportedStrategies))
	}
	if q := s.DefaultMemory; q != nil {
		// AsInt64 fails for fractional bytes ("100m") and for values beyond
		// int64, both of which the allocator cannot account.
		if v, ok := q.AsInt64(); !ok || v <= 0 {
			errs = append(errs, field.Invalid(path.Child("defaultMemory"), q.String(), "must be a positive whole number of bytes"))
		}
	}
	if v := s.DefaultCores; v != nil && (*v < 1 || *v > 100) {
		errs = append(errs, field.Invalid(path.Child("defaultCores"), *v, "must be between 1 and 100"))
	}
	if v := s.MaxSharesPerGPU; v != nil && (*v < 1 || *v > maxSharesPerGPULimit) {
		errs = append(errs, field.Invalid(path.Child("maxSharesPerGPU"), *v, "must be between 1 and 100"))
	}
	if v := s.MemoryOvercommitPercent; v != nil && (*v < 100 || *v > MaxMemoryOvercommitPercent) {
		errs = append(errs, field.Invalid(path.Child("memoryOvercommitPercent"), *v, fmt.Sprintf("must be between 100 (no over-commit) and %d", MaxMemoryOvercommitPercent)))
	}
	if v := s.Priority; v != nil && *v != PriorityHigh && *v != PriorityLow {
		errs = append(errs, field.Invalid(path.Child("priority"), *v, priorityRange))
	}
	switch s.MPSMode {
	case "":
	case MPSIsolated, MPSConcurrent:
		// An empty strategy is MPS, the default.
		if s.Strategy != "" && s.Strategy != SharingMPS {
			errs = append(errs, field.Invalid(path.Child("mpsMode"), s.MPSMode, fmt.Sprintf(
				"applies to sharing.strategy %s only, not %s; leave it unset", SharingMPS, s.Strategy)))
		}
	default:
		errs = append(errs, field.NotSupported(path.Child("mpsMode"), s.MPSMode, supportedMPSModes))
	}
	return errs
}
