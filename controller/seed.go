package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
)

// seedDemand gives the demand mix of ranking by stranding the shapes of
// the pods already running, once the caches are synced and before any
// decision (Planner.Seed): a restarted controller ranks as it did before.
func (c *Controller) seedDemand(ctx context.Context) {
	if !c.planner.RanksByStranding() {
		return
	}
	running := c.runningPods(ctx)
	n := c.planner.Seed(ctx, running)
	klog.FromContext(ctx).Info("Seeded the demand mix from running pods", "pods", n, "withClaims", len(running))
}

// runningPods lists the pods bound to a node and not finished, with their
// allocated claims (those the lister has; a pod none of whose claims is
// allocated is left out).
func (c *Controller) runningPods(ctx context.Context) []planner.RunningPod {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing pods to seed the demand mix")
		return nil
	}
	var out []planner.RunningPod
	for _, pod := range pods {
		if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
			continue
		}
		var claims []*resourceapi.ResourceClaim
		var interpreted []*planner.Claim
		for i := range pod.Spec.ResourceClaims {
			name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
			if err != nil || name == nil {
				continue
			}
			claim, err := c.claims.ResourceClaims(pod.Namespace).Get(*name)
			if err != nil || claim.Status.Allocation == nil {
				continue
			}
			claims = append(claims, claim)
			// Its selectors give the shape the products it may run on;
			// a claim that is not gpulink's or no longer interprets
			// (its class gone) gives none.
			ic, kind, err := c.interp.Interpret(ctx, claim)
			if err != nil || kind != planner.ClaimOurs {
				ic = nil
			}
			interpreted = append(interpreted, ic)
		}
		if len(claims) > 0 {
			out = append(out, planner.RunningPod{Pod: pod, Claims: claims, Interpreted: interpreted})
		}
	}
	return out
}
