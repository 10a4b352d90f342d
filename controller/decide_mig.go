package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/allocate"
)

// decideMIG chooses the node and devices for a pod whose pending claims
// ask for MIG devices, under the decision lock: the node filter picks the
// candidates, chooseMIG plans and ranks them. It returns the chosen plan
// (nil when nothing fits), the feasible plans, why nodes failed and which
// filters rejected nodes, as allocatePod's other paths do.
func (c *Controller) decideMIG(ctx context.Context, logger klog.Logger, pod *corev1.Pod, all []*planner.NodeInventory, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string], pending []*planner.Claim, pol allocate.Policy, rank *planner.HostRanking) (*planner.Plan, []*planner.Plan, []string, *planner.Rejections) {
	cands, rej := c.filter.Candidates(logger, pod, all, allocated, excluded)
	if len(cands) == 0 && excluded.Len() > 0 && rej.Count(planner.RejectExcluded) > 0 {
		// As the exhaustive path: every node was ruled out, some by
		// earlier failures; start over rather than wait forever.
		c.resetExcluded(ctx, pod)
		cands, rej = c.filter.Candidates(logger, pod, all, allocated, nil)
	}
	chosen, plans, why, failed := planner.ChooseMIG(ctx, c.sel, pol, cands, c.ledger, pending, rank)
	noFit := "no " + planner.WantedDevices(pending)
	for range failed {
		rej.Add(noFit)
	}
	return chosen, plans, why, rej
}
