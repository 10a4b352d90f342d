package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/report"
)

// reportBoundElsewhere says so when a bound pod's gpulink claim is
// allocated on another node than the pod's. kube-scheduler binds a pod
// only to the node its claims' allocations select, so this is the
// residual of settle.go (a PreBind whose re-read of a released claim
// came after the claim was allocated again elsewhere), or a pod created
// with spec.nodeName naming another node than its claim's. The kubelet
// plugin then refuses to prepare the claim for good ("pool X is not this
// node's pool Y"), and only a new pod can run: the Warning names the
// nodes and what to do, once per pod, and
// errors_total{reason="bound_elsewhere"} counts it for alerts. Nothing is
// released: the claim's reservation is the pod's, and its allocation may
// be what the pod's replacement gets.
func (c *Controller) reportBoundElsewhere(ctx context.Context, pod *corev1.Pod, pc podClaims) {
	for _, ic := range pc.ours {
		node := allocatedNode(ic.Claim)
		if node == "" || node == pod.Spec.NodeName {
			continue
		}
		c.mu.Lock()
		seen := c.boundElsewhere.Has(pod.UID)
		c.boundElsewhere.Insert(pod.UID)
		c.mu.Unlock()
		if seen {
			return
		}
		msg := fmt.Sprintf("pod is bound to node %s but its claim %s is allocated on node %s, so the kubelet cannot prepare it and the pod cannot start; delete the pod so that it is created again (kube-scheduler bound it with an allocation released and made again elsewhere, or the pod was created with spec.nodeName)",
			pod.Spec.NodeName, ic.Claim.Name, node)
		klog.FromContext(ctx).Error(nil, "Bound pod's claim is allocated on another node", "node", pod.Spec.NodeName, "claim", klog.KObj(ic.Claim), "claimNode", node)
		c.metrics.Errors.WithLabelValues(errReasonBoundElsewhere).Inc()
		c.explain.event(pod, ic.Claim, corev1.EventTypeWarning, report.ReasonBoundElsewhere, actionAllocate, msg)
		return
	}
}

// forgetBoundElsewhere drops a deleted pod's record.
func (c *Controller) forgetBoundElsewhere(pod *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.boundElsewhere.Delete(pod.UID)
}
