package kubeletplugin

import (
	"fmt"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

// checkClaimShape rejects combinations the claim's containers cannot be
// set up for: a GPU given whole and in shares (or whole twice) in one
// claim, shares of one GPU with different strategies, MPS shares asking
// different core percentages on different GPUs (one MPS server has one
// active thread percentage), MPS shares of both modes, and Concurrent MPS
// shares on more than one GPU (each GPU has its group's daemon, and a
// container reaches one). MPS shares beside GPUs outside MPS are fine:
// each request's containers get their own view (cdiviews.go).
func checkClaimShape(pc *PreparedClaim, resultIdx []int) error {
	field := func(j int) string { return resultField(resultIdx[j]) }
	whole := map[int]int{}
	shared := map[int]int{}
	strategy := map[int]apiv1alpha1.SharingStrategy{}
	mpsGPU := -1
	if err := checkClaimMPSMode(pc, field); err != nil {
		return err
	}
	for j, dev := range pc.Devices {
		if dev.MIG != nil {
			continue // exclusive devices of their own: checkMIGConflicts
		}
		if dev.Share == nil {
			if k, ok := whole[dev.Index]; ok {
				return fmt.Errorf("%s.device: %q is allocated whole twice (also in %s)", field(j), dev.Device, field(k))
			}
			if k, ok := shared[dev.Index]; ok {
				return fmt.Errorf("%s.device: %q is allocated whole and as a share (%s) in the same claim", field(j), dev.Device, field(k))
			}
			whole[dev.Index] = j
			continue
		}
		if k, ok := whole[dev.Index]; ok {
			return fmt.Errorf("%s.device: %q is allocated as a share and whole (%s) in the same claim", field(j), dev.Device, field(k))
		}
		if s, ok := strategy[dev.Index]; ok && s != dev.Share.Strategy {
			return fmt.Errorf("%s: shares of %q use sharing strategies %s and %s; one GPU takes one strategy", field(j), dev.Device, s, dev.Share.Strategy)
		}
		strategy[dev.Index] = dev.Share.Strategy
		if _, ok := shared[dev.Index]; !ok {
			shared[dev.Index] = j
		}
		if dev.Share.Strategy == apiv1alpha1.SharingMPS && mpsGPU < 0 {
			mpsGPU = dev.Index
		}
	}
	if mpsGPU < 0 {
		return nil
	}
	// The summed percentages per GPU, as the daemon and the container's
	// GPULINK_SHARE_CORES_<n> get them.
	var first *claimGPU
	for _, g := range claimGPUs(pc) {
		if g.share == nil || g.share.Strategy != apiv1alpha1.SharingMPS {
			continue
		}
		if first == nil {
			first = &g
			continue
		}
		if g.share.Cores != first.share.Cores {
			j := shared[g.index]
			return fmt.Errorf("%s.consumedCapacity.%s: the claim's MPS shares ask %d%% of the cores of GPU %d and %d%% of GPU %d; one MPS server applies one active thread percentage to all the claim's GPUs, so ask the same on each", field(j), driver.CapacityCores, first.share.Cores, first.index, g.share.Cores, g.index)
		}
	}
	return nil
}

// checkClaimMPSMode refuses a claim whose MPS shares mix the two modes
// (its containers reach one MPS daemon, the claim's own or its group's)
// and a claim with Concurrent MPS shares on more than one GPU (its group
// has a daemon per GPU, and a client reaches one daemon).
func checkClaimMPSMode(pc *PreparedClaim, field func(int) string) error {
	first, firstGPU := -1, -1
	for j, dev := range pc.Devices {
		if dev.Share == nil || dev.Share.Strategy != apiv1alpha1.SharingMPS {
			continue
		}
		if first < 0 {
			first = j
			if dev.Share.concurrentMPS() {
				firstGPU = dev.Index
			}
			continue
		}
		if a, b := pc.Devices[first].Share.concurrentMPS(), dev.Share.concurrentMPS(); a != b {
			return fmt.Errorf("%s: sharing.mpsMode %s, but %s has %s; a container reaches one MPS daemon, so a claim's MPS shares must all come from classes of one MPS mode",
				field(j), mpsModeName(b), field(first), mpsModeName(a))
		}
		if dev.Share.concurrentMPS() && dev.Index != firstGPU {
			return fmt.Errorf("%s.device: %q, but %s is on GPU %d: Concurrent MPS shares are served by their namespace's MPS daemon on their GPU and a container reaches one daemon, so a claim's Concurrent MPS shares must all be on one GPU (sharing.mpsMode %s)",
				field(j), dev.Device, field(first), firstGPU, apiv1alpha1.MPSConcurrent)
		}
	}
	if first >= 0 && firstGPU >= 0 && pc.Namespace == "" {
		return fmt.Errorf("%s: a Concurrent MPS share of a claim without a namespace: its namespace is its sharing group", field(first))
	}
	return nil
}

// mpsModeName names a share's MPS mode in messages.
func mpsModeName(concurrent bool) apiv1alpha1.MPSMode {
	if concurrent {
		return apiv1alpha1.MPSConcurrent
	}
	return apiv1alpha1.MPSIsolated
}
