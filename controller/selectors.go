package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
)

// defaultSelectorAttempt bounds the time one attempt spends evaluating a pod's
// claims' CEL selectors on the cluster's devices before its decision.
// One at the API's cost limit takes seconds per device
// (planner.PrepareSelectors). The nodes evaluated within the bound stay memoised, so a costly selector progresses over
// attempts (each requeued with the workqueue's backoff) and only ever
// occupies one worker for this long at a time.
const defaultSelectorAttempt = 10 * time.Second

// prepareSelectors evaluates the pending claims' selectors outside the
// decision lock (planner.PrepareSelectors). When one attempt's time is
// spent, the pod gets a Warning and an error requeues it with backoff.
func (c *Controller) prepareSelectors(ctx context.Context, key string, pod *corev1.Pod, pending []*planner.Claim) error {
	actx, cancel := context.WithTimeout(ctx, c.selectorAttempt)
	defer cancel()
	err := c.planner.PrepareSelectors(actx, pending)
	if err == nil || ctx.Err() != nil {
		return nil
	}
	c.setWaiting(key, true)
	msg := fmt.Sprintf("evaluating the CEL selectors of this pod's claims on the cluster's devices took more than %s; gpulink goes on evaluating them at the next attempts, outside the decision other pods wait for. Simpler selectors are decided at once", c.selectorAttempt)
	klog.FromContext(ctx).Info("Selectors too costly for one attempt; requeued", "err", err)
	c.explain.event(pod, pending[0].Claim, corev1.EventTypeWarning, report.ReasonSelectorsCostly, actionWait, msg)
	return fmt.Errorf("pod %s: %w", key, err)
}
