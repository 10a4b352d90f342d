package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
)

// A gang's pod that kube-scheduler refused after it was ungated.
//
// Once a gang's pods are ungated, kube-scheduler binds them one by one.
// When it cannot bind one on the node its claims are allocated on (CPU
// taken meanwhile, a node taint), its DRA plugin deallocates the claims,
// or the controller releases them (checkUnschedulable), and the node is
// excluded for the pod (onDeallocated). The pod cannot be gated again
// (the API only removes scheduling gates), and its gang's other pods may
// run already: the whole gang is not placed again. The refused pod alone
// is placed again, within the domain of the gang's Required level that
// its placed pods share (as a pod joining a running gang is), a
// ComputeDomain gang's clique included, with a GangPodReplaced event on
// the pod naming that domain. Without a Required level, or before any
// other pod of the gang has a node, it may go anywhere, as before.

// replaceGangPod places again an ungated pod of a gang whose gpulink
// claims lost their allocation.
func (c *Controller) replaceGangPod(ctx context.Context, key string, pod *corev1.Pod, ref gangs.Ref, pc podClaims, pending []*planner.Claim) error {
	logger := klog.FromContext(ctx).WithValues("gang", ref.Key())
	spec, isGang, notReady, err := c.gangSpec(ref, pod)
	if err != nil || notReady != "" || !isGang {
		return c.allocatePod(ctx, key, pod, pc, pending)
	}
	members := c.gangMembers(ctx, ref)
	self := &gangMember{pod: pod, key: key, pc: pc}
	if spec, err = c.computeDomainSpec(spec, append(members, self)); err != nil {
		c.explain.event(pod, nil, corev1.EventTypeWarning, report.ReasonGangWaiting, actionWait, "waiting: "+err.Error())
		c.setWaiting(key, true)
		return nil
	}
	within := c.gangDomain(spec, members)
	if within != nil {
		msg := fmt.Sprintf("%s: pod %s lost its allocation after it was handed to kube-scheduler; placing it again on its own within the %s its gang's placed pods share (%d nodes); the gang's other pods are not moved",
			spec.Ref, pod.Name, c.levelLabel(spec), len(within))
		logger.V(2).Info("Placing a refused gang pod again within its gang's domain", "nodes", len(within))
		c.explain.event(pod, pending[0].Claim, corev1.EventTypeNormal, report.ReasonGangPodReplaced, actionAllocate, msg)
	}
	return c.allocatePodWithin(ctx, key, pod, pc, pending, within)
}

// levelLabel names the gang's level for messages: "leaf" or the key.
func (c *Controller) levelLabel(spec gangs.Spec) string {
	if level, ok := c.hierarchy.LevelOfKey(spec.Level); ok {
		return c.hierarchy.Name(level)
	}
	return spec.Level
}
