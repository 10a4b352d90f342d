package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver/gang"
)

// Gangs with ComputeDomains.
//
// A pod that claims a channel of an NVIDIA ComputeDomain (a claim whose
// request's DeviceClass selects driver compute-domain.nvidia.com's
// channel devices) shares GPU memory over multi-node NVLink with the
// domain's other pods, through an IMEX domain that cannot span two NVLink
// cliques. gpulink never allocates that claim (kube-scheduler does, and
// NVIDIA's driver prepares it), but it places the pod's GPUs: a gang with
// such a pod is kept in one clique, Required at the hierarchy's clique
// level (gang.LabelClique), whatever level the gang names above it. A
// gang that names a tighter Required level (one node) keeps it. A
// hierarchy without the clique level cannot honour this: the gang waits
// with an event saying so, rather than be spread over racks whose GPUs
// cannot reach each other.

// computeDomainChannel names the first claim of the member's pod that asks
// for a ComputeDomain channel, and its DeviceClass; "" when none does.
func (c *Controller) computeDomainChannel(m *gangMember) (claim, class string) {
	for _, cl := range m.pc.all {
		for _, name := range requestClasses(cl) {
			dc, err := c.classes.Get(name)
			if err != nil {
				continue
			}
			if c.sel.ComputeDomainClass(dc) == "channel" {
				return cl.Name, name
			}
		}
	}
	return "", ""
}

// requestClasses are the DeviceClasses a claim's requests name, the
// alternatives of firstAvailable included.
func requestClasses(cl *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range cl.Spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			out = append(out, s.DeviceClassName)
		}
	}
	return out
}

// computeDomainSpec returns the gang's spec kept within one NVLink clique
// when one of its pods claims a ComputeDomain channel: Required at the
// clique level unless it asks for a tighter Required level. The error
// says why that cannot be done (no clique level in the hierarchy).
func (c *Controller) computeDomainSpec(spec gangs.Spec, members []*gangMember) (gangs.Spec, error) {
	var pod, claim, class string
	for _, m := range members {
		if claim, class = c.computeDomainChannel(m); claim != "" {
			pod = m.pod.Name
			break
		}
	}
	if claim == "" {
		return spec, nil
	}
	clique, ok := c.hierarchy.LevelOfKey(gang.LabelClique)
	if !ok {
		return spec, fmt.Errorf("%s: pod %s claims a ComputeDomain channel (claim %s, DeviceClass %s), whose pods must share one NVLink clique, but the controller's gang hierarchy (%v) has no %s level; add it to the chart's gangs.hierarchy",
			spec.Ref, pod, claim, class, c.hierarchy.Keys(), gang.LabelClique)
	}
	if spec.Level != "" && spec.Policy == gangs.Required {
		level, ok := c.hierarchy.LevelOfKey(spec.Level)
		if !ok {
			level, ok = c.hierarchy.LevelOfName(spec.Level)
		}
		if ok && level <= clique {
			return spec, nil
		}
	}
	spec.Level, spec.Policy = gang.LabelClique, gangs.Required
	spec.Why = fmt.Sprintf("pod %s claims ComputeDomain channel %s (DeviceClass %s)", pod, claim, class)
	return spec, nil
}

// computeDomainNote is what a waiting gang's event adds when its level
// comes from a ComputeDomain ("" otherwise), with how its pods were
// counted per node (channelSlots).
func computeDomainNote(spec gangs.Spec) string {
	if !strings.Contains(spec.Why, "ComputeDomain") {
		return ""
	}
	return "; kept in one " + gang.LabelClique + " domain because " + spec.Why +
		"; at most one pod per free ComputeDomain channel of a node (kube-scheduler gives each pod's channel claim a channel of its node)"
}

// channelRequest is a request for a ComputeDomain channel in one of a
// pod's claims: its class's and its own CEL selectors, tolerations and
// count.
type channelRequest struct {
	selectors   []string
	tolerations []resourceapi.DeviceToleration
	count       int
}

// channelRequests are the channel requests of the pod's unallocated
// claims (firstAvailable alternatives are not counted).
func (c *Controller) channelRequests(m *gangMember) []channelRequest {
	var out []channelRequest
	for _, cl := range m.pc.all {
		if cl.Status.Allocation != nil {
			continue
		}
		for _, r := range cl.Spec.Devices.Requests {
			if r.Exactly == nil {
				continue
			}
			dc, err := c.classes.Get(r.Exactly.DeviceClassName)
			if err != nil || c.sel.ComputeDomainClass(dc) != "channel" {
				continue
			}
			cr := channelRequest{tolerations: r.Exactly.Tolerations, count: int(max(r.Exactly.Count, 1))}
			for _, s := range append(slices.Clone(dc.Spec.Selectors), r.Exactly.Selectors...) {
				if s.CEL != nil {
					cr.selectors = append(cr.selectors, s.CEL.Expression)
				}
			}
			out = append(out, cr)
		}
	}
	return out
}

// boundByChannels bounds each candidate node's slots by how many pods
// with channel requests it holds (channelSlots), when a ready pod of the
// gang claims a ComputeDomain channel: the first such pod's requests
// (pods of a gang share one template). Pods without a channel (a
// launcher) are counted alike, which may keep them off a node they would
// fit on, but never places more channel pods on a node than it has
// channels. Called under the decision lock.
func (c *Controller) boundByChannels(ctx context.Context, ready []*gangMember, nodes []gang.Node) {
	var reqs []channelRequest
	for _, m := range ready {
		if reqs = c.channelRequests(m); len(reqs) > 0 {
			break
		}
	}
	if len(reqs) == 0 {
		return
	}
	for i := range nodes {
		if nodes[i].Slots > 0 {
			nodes[i].Slots = min(nodes[i].Slots, c.channelSlots(ctx, reqs, nodes[i].Name))
		}
	}
}

// channelSlots bounds how many pods with the channel requests reqs (of
// the gang's representative pod, not empty) the node holds:
// kube-scheduler allocates each pod's channel claim on the node gpulink
// put the pod's GPUs on, once the gate is gone, and NVIDIA's driver
// publishes one default channel per node (channel-0), which one claim
// holds at a time. A pod placed beyond the node's free channels would be
// refused by kube-scheduler after the gang was ungated, and the gang
// would run in part. The bound is, over the requests, the node's free
// devices the request's class and selectors match, divided by its count.
func (c *Controller) channelSlots(ctx context.Context, reqs []channelRequest, node string) int {
	slots := -1
	for _, r := range reqs {
		n := 0
		// A selector that does not compile matches nothing for
		// kube-scheduler either: no pod fits.
		if free, err := c.planner.FreeForeignDevices(ctx, node, r.selectors, r.tolerations); err == nil {
			n = free / r.count
		}
		if slots < 0 || n < slots {
			slots = n
		}
	}
	return max(slots, 0)
}
