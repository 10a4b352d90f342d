package v1alpha1

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// CheckClaimNarrows refuses claim layers that widen what the DeviceClass
// layers allow for the settings that protect the other tenants of a GPU.
// A claim is written by whoever may create claims in a namespace, a
// DeviceClass by the cluster operator, so those settings must be the
// class's (or, where the class leaves them unset, the operator's defaults):
//
//   - sharing.strategy confines a share to its memory and cores. A claim may
//     only repeat the class's effective strategy: HAMiCore is enforced only
//     if the workload's own image loads the library, and None puts no limit
//     on a share at all, so neither is a narrowing of MPS.
//   - sharing.maxSharesPerGPU caps how many tenants share one GPU. A claim
//     may lower it for its own shares, never raise it above the class's.
//   - sharing.memoryOvercommitPercent lets shares of a GPU add up past its
//     memory. A claim may lower it, never raise it above the class's
//     (default 100: none).
//   - sharing.mpsMode decides whether the server enforces a share's limits
//     (Isolated) or its clients set them, sharing one server with the
//     claims of their namespace (Concurrent), and so which shares a GPU may
//     carry together. A claim may only repeat the class's effective mode.
//
// Everything else a claim may set freely: the topology policy and minLink
// only decide where the claim's own GPUs go, and the share sizes
// (defaultMemory, defaultCores) are what the claim's own shares are
// accounted for, so a larger one takes capacity from no one. So is
// sharing.priority: HAMi lets every pod choose its task priority, and MPS
// orders with it only the clients of one server, which are the claim's own
// (Isolated) or those of its namespace's claims on the GPU (Concurrent),
// whose priorities are that namespace's to choose.
//
// The error is an aggregate of field errors naming the field, the claim's
// value and the class's.
func CheckClaimNarrows(class, claim []*GpuConfig) error {
	want := Merge(claim...).Sharing
	if want == nil {
		return nil
	}
	set := Merge(class...)
	allowed := set.DeepCopy()
	allowed.Default()
	path := field.NewPath("sharing")
	// The class's settings are the yardstick, so they must be valid on
	// their own: a claim must not be able to repair (and thereby choose) a
	// broken class value.
	if errs := validateSharing(allowed.Sharing, path); len(errs) > 0 {
		return fmt.Errorf("invalid DeviceClass GpuConfig: %w", errs.ToAggregate())
	}
	origin := func(explicit bool) string {
		if explicit {
			return "the DeviceClass's"
		}
		return "the default"
	}
	var errs field.ErrorList
	if s := want.Strategy; s != "" && s != allowed.Sharing.Strategy {
		errs = append(errs, field.Forbidden(path.Child("strategy"), fmt.Sprintf(
			"the claim sets %s but the sharing strategy is %s (%s); it protects the other tenants of a GPU, so only the DeviceClass chooses it and a claim may only repeat it",
			s, allowed.Sharing.Strategy, origin(set.Sharing != nil && set.Sharing.Strategy != ""))))
	}
	// An unknown mode is left to validation, which lists the known ones.
	if m := want.MPSMode; slices.Contains(supportedMPSModes, m) && m != allowed.Sharing.MPSMode {
		effective := string(allowed.Sharing.MPSMode)
		if effective == "" {
			effective = "unset (sharing.strategy " + string(allowed.Sharing.Strategy) + " has no MPS mode)"
		}
		errs = append(errs, field.Forbidden(path.Child("mpsMode"), fmt.Sprintf(
			"the claim sets %s but the MPS mode is %s (%s); it decides which shares of a GPU share an MPS server and whether the server enforces their limits, so only the DeviceClass chooses it and a claim may only repeat it",
			m, effective, origin(set.Sharing != nil && set.Sharing.MPSMode != ""))))
	}
	if n, limit := want.MaxSharesPerGPU, allowed.Sharing.MaxSharesPerGPU; n != nil && limit != nil && *n > *limit {
		errs = append(errs, field.Forbidden(path.Child("maxSharesPerGPU"), fmt.Sprintf(
			"the claim sets %d but at most %d shares per GPU are allowed (%s); a claim may only lower it",
			*n, *limit, origin(set.Sharing != nil && set.Sharing.MaxSharesPerGPU != nil))))
	}
	classOvercommit := 100
	if v := allowed.Sharing.MemoryOvercommitPercent; v != nil {
		classOvercommit = *v
	}
	if n := want.MemoryOvercommitPercent; n != nil && *n > classOvercommit {
		errs = append(errs, field.Forbidden(path.Child("memoryOvercommitPercent"), fmt.Sprintf(
			"the claim sets %d but the DeviceClass allows %d%% (%s); memory over-commit is the operator's opt-in, a claim may only lower it",
			*n, classOvercommit, origin(set.Sharing != nil && set.Sharing.MemoryOvercommitPercent != nil))))
	}
	if len(errs) > 0 {
		return fmt.Errorf("claim GpuConfig: %w", errs.ToAggregate())
	}
	return nil
}
