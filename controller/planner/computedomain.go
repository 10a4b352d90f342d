package planner

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
)

// ComputeDomainDriver is the DRA driver of NVIDIA's ComputeDomains
// (k8s-dra-driver-gpu): it publishes an IMEX channel device and a daemon
// device per node, and a pod that claims a channel of a ComputeDomain
// shares GPU memory over multi-node NVLink with the domain's other pods.
// Its devices are never gpulink's to allocate: kube-scheduler allocates
// the channel claim (the ComputeDomain's resourceClaimTemplate) and the
// NVIDIA driver prepares it.
const ComputeDomainDriver = "compute-domain.nvidia.com"

// computeDomainProbe stands for a ComputeDomain device of the given type
// ("channel" or "daemon") as the NVIDIA driver publishes them, so that a
// class is recognised before any such slice exists (as probeDevice does
// for gpulink's classes). The shipped classes select
// device.driver == 'compute-domain.nvidia.com' &&
// device.attributes['compute-domain.nvidia.com'].type == 'channel'
// (&& ...id == 0 for the default channel).
func computeDomainProbe(kind string) dracel.Device {
	return dracel.Device{Driver: ComputeDomainDriver, AllowMultipleAllocations: ptr.To(false),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To(kind)},
			"id":   {IntValue: ptr.To(int64(0))},
		}}
}

// ComputeDomainClass tells which ComputeDomain devices a DeviceClass
// selects: "channel", "daemon", or "" for none (any class with no
// selectors, a selector that does not compile or that does not match the
// probe device: such a class is someone else's, and what it selects is
// decided by its own rules).
func (e *SelectorEvaluator) ComputeDomainClass(class *resourceapi.DeviceClass) string {
	if len(class.Spec.Selectors) == 0 {
		return ""
	}
	for _, kind := range []string{"channel", "daemon"} {
		probe := computeDomainProbe(kind)
		all := true
		for _, s := range class.Spec.Selectors {
			if s.CEL == nil {
				return ""
			}
			p, err := e.compile(s.CEL.Expression)
			if err != nil {
				return ""
			}
			// The probe's evaluation is CPU only and bounded by CEL's
			// cost limit: no caller's context to honour.
			m, _, err := p.DeviceMatches(context.Background(), probe)
			if err != nil || !m {
				all = false
				break
			}
		}
		if all {
			return kind
		}
	}
	return ""
}

// FreeForeignDevices counts the devices of other drivers on the node that
// kube-scheduler could give a request with these CEL selectors (its
// class's and its own) and tolerations: those every selector matches,
// that no claim holds (as the ledger knows them: allocated, or assumed by
// a decision of ours) and whose NoSchedule and NoExecute taints are
// tolerated. A device that allows multiple allocations counts as free
// whoever holds it. The error is a selector's compilation error.
//
// It bounds how many pods claiming a ComputeDomain channel a node holds
// (controller/gang_computedomain.go): kube-scheduler allocates each such
// pod's channel claim on the node gpulink placed the pod's GPUs on, and
// NVIDIA's driver publishes one default channel per node.
func (p *Planner) FreeForeignDevices(ctx context.Context, node string, selectors []string, tolerations []resourceapi.DeviceToleration) (int, error) {
	v := p.inv.Foreign(node)
	if v == nil {
		return 0, nil
	}
	match := make([]bool, len(v.Devices))
	for i := range match {
		match[i] = true
	}
	for _, expr := range selectors {
		row, err := v.matching(ctx, p.sel, expr)
		if err != nil {
			return 0, err
		}
		for i, m := range row {
			match[i] = match[i] && m
		}
	}
	fr := &ForeignRequest{Tolerations: tolerations}
	free := 0
	for i, d := range v.Devices {
		if !match[i] {
			continue
		}
		if _, bad := untoleratedForeignTaint(d, fr); bad {
			continue
		}
		shared := d.CEL.AllowMultipleAllocations != nil && *d.CEL.AllowMultipleAllocations
		if !shared && p.ledger.ForeignHeld(d.Key()) {
			continue
		}
		free++
	}
	return free, nil
}
