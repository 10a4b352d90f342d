package planner

import (
	"cmp"
	"fmt"

	"github.com/gpulink/gpulink/api/v1alpha1"
)

// Which claims MPS serves, and the modes a pod may mix.

// UsesMPS says whether any alternative of the claim is a share served by
// MPS (the configuration is defaulted, so an unset strategy reads MPS).
func (ic *Claim) UsesMPS() bool {
	for _, r := range ic.Requests {
		for _, alt := range r.Alternatives {
			if alt.Share && alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.Strategy == v1alpha1.SharingMPS {
				return true
			}
		}
	}
	return false
}

// checkMPSModes refuses a claim whose MPS shares take both MPS modes: the
// kubelet plugin serves a claim's MPS shares from one kind of server (a
// daemon of the claim's own, or its namespace's daemon of one GPU).
func checkMPSModes(ic *Claim) error {
	var isolated, concurrent string
	for _, rs := range ic.Requests {
		for _, alt := range rs.Alternatives {
			switch {
			case !alt.Share || shareStrategy(alt) != v1alpha1.SharingMPS:
			case alt.ShareGroup != "":
				concurrent = cmp.Or(concurrent, alt.ResultName+" (DeviceClass "+alt.Class.Name+")")
			default:
				isolated = cmp.Or(isolated, alt.ResultName+" (DeviceClass "+alt.Class.Name+")")
			}
		}
	}
	if isolated != "" && concurrent != "" {
		return fmt.Errorf("request %s asks for an MPS share with sharing.mpsMode=%s and request %s one with sharing.mpsMode=%s; one claim's MPS shares take one mode, so put them in separate claims",
			isolated, v1alpha1.MPSIsolated, concurrent, v1alpha1.MPSConcurrent)
	}
	return nil
}

// UsesConcurrentMPS tells whether any alternative of the claim is a
// concurrent MPS share.
func (ic *Claim) UsesConcurrentMPS() bool {
	for _, rs := range ic.Requests {
		for _, alt := range rs.Alternatives {
			if alt.ShareGroup != "" {
				return true
			}
		}
	}
	return false
}
