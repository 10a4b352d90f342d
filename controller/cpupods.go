package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
)

// Pods without GPU claims (Config.PlaceCPUPods, --place-cpu-pods;
// docs/cpu-pods.md).
//
// The chart's opt-in admission policy (gate.cpuPods) gates pods that
// reference no resource claim. With PlaceCPUPods the controller chooses
// the node where such a pod strands the least GPU (Planner.DecideHost),
// nominates it (status.nominatedNodeName) and lifts the gate in a write
// that also adds a *preferred* node affinity term for that node (weight
// 100, matchFields metadata.name). Why these, and not the alternative:
//
//   - A required term (or a nodeSelector) would bind the pod to the node
//     for good: scheduling directives of a gated pod can be added or
//     tightened, never relaxed once the gate is gone (KEP-3838), so a
//     node that fills up, is cordoned or tainted before kube-scheduler
//     binds the pod would leave it Pending forever. Only a controller
//     that deletes and recreates pods could undo it, and pods are not
//     ours to recreate.
//   - The nomination: kube-scheduler evaluates a pod's nominated node
//     before any other and binds it there when the node passes the
//     filters; otherwise it searches the other nodes as usual. It also
//     counts the pod on that node against pods of no higher priority
//     meanwhile, as FitTracker.Assume does here.
//   - The preferred term is a score, not a filter: kube-scheduler's
//     NodeAffinity score (weight 2 in the default profile) gives the node
//     100 × 2 points over nodes that do not match, more than
//     NodeResourcesFit's and BalancedAllocation's spreading together. But
//     it only scores the nodes it sampled (percentageOfNodesToScore:
//     about half of 200 nodes), so alone it steered 56 % of a burst on
//     200 nodes (docs/cpu-pods.md); it stays as the fallback should the
//     nomination, which kube-scheduler owns, be cleared first.
//
// The pod counts on the chosen node for later decisions (FitTracker.
// Assume) until it binds, wherever it binds, or turns unschedulable.

// OutcomeHostPlaced counts pods without GPU claims whose gate the
// controller lifted with a preferred node (Metrics.Decisions).
const OutcomeHostPlaced = "host_placed"

// preferredNodeWeight is the weight of the preferred node term: the
// largest the API allows, so that the node outscores every spreading
// score kube-scheduler's default profile gives.
const preferredNodeWeight = 100

// placeHostPod places a gated pod without resource claims and hands it to
// kube-scheduler. Any failure to choose lifts the gate without a
// preference: the pod is never kept gated for the controller's sake.
func (c *Controller) placeHostPod(ctx context.Context, pod *corev1.Pod) error {
	logger := klog.FromContext(ctx)
	if !c.ungating.start(pod.UID) {
		return nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		c.ungating.done(pod.UID)
		return fmt.Errorf("listing nodes for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	c.decideMu.Lock()
	d, err := c.planner.DecideHost(ctx, planner.HostRequest{Pod: pod, Nodes: nodes})
	if err == nil && d.Node != "" {
		// Counted before the lock is released, so that the next
		// decision sees the CPU and memory taken.
		c.fit.Assume(pod, d.Node)
	}
	c.decideMu.Unlock()
	if err != nil {
		logger.Error(err, "Handing the pod without GPU claims to kube-scheduler without a node preference")
		d.Node = ""
	}
	if d.Node != "" {
		nominated, err := c.nominate(ctx, pod, d.Node)
		if err != nil {
			// The preferred term still steers the pod where kube-scheduler
			// scores the node.
			logger.V(2).Info("Could not nominate the node; the preferred node term alone steers the pod", "node", d.Node, "err", err)
		} else {
			// The gate removal tests the pod's resourceVersion: the one
			// the nomination wrote, not the cache's.
			pod = nominated
		}
	}
	if err := c.ungatePreferring(ctx, pod, d.Node); err != nil {
		c.ungating.done(pod.UID)
		if d.Node != "" {
			c.fit.Unassume(pod.UID)
		}
		return err
	}
	if d.Node == "" {
		logger.V(2).Info("Removed scheduling gate from pod without GPU claims; no GPU node to steer it from", "candidates", d.Candidates)
		c.explain.event(pod, nil, corev1.EventTypeNormal, report.ReasonGateRemoved, actionUngate,
			fmt.Sprintf("no gpulink claims and no GPU node among its %d candidate node(s): handed to kube-scheduler", d.Candidates))
		return nil
	}
	c.metrics.Decisions.WithLabelValues(OutcomeHostPlaced).Inc()
	logger.V(2).Info("Removed scheduling gate from pod without GPU claims, preferring a node", "node", d.Node, "candidates", d.Candidates, "gpuNodes", d.GPUNodes)
	c.explain.event(pod, nil, corev1.EventTypeNormal, report.ReasonGateRemoved, actionUngate,
		fmt.Sprintf("no gpulink claims: handed to kube-scheduler preferring node %s, where its CPU and memory strand the least GPU (of %d candidate nodes, %d with GPUs)",
			d.Node, d.Candidates, d.GPUNodes))
	return nil
}

// ungatePreferring removes gpulink's gate and, when node is set, adds the
// preferred node term in the same patch. The patch tests the pod's UID
// and resourceVersion, so that a pod changed since the cache saw it
// (affinity or gates edited) is read again rather than overwritten.
func (c *Controller) ungatePreferring(ctx context.Context, pod *corev1.Pod, node string) error {
	return c.patchPodOrFresh(ctx, pod, func(ctx context.Context, p *corev1.Pod) error {
		return c.patchPreferring(ctx, p, node)
	})
}

func (c *Controller) patchPreferring(ctx context.Context, pod *corev1.Pod, node string) error {
	patch, err := preferencePatch(pod, node)
	if err != nil || patch == nil {
		return err
	}
	_, err = c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing scheduling gate %s from pod %s/%s (preferred node %q): %w", driver.SchedulingGate, pod.Namespace, pod.Name, node, err)
	}
	c.metrics.GateWait.Observe(time.Since(pod.CreationTimestamp.Time).Seconds())
	return nil
}

// nominate sets the gated pod's status.nominatedNodeName to node, before
// the gate goes: kube-scheduler evaluates a pod's nominated node before
// any other and takes it when it passes the filters, and only searches
// the other nodes when it does not (schedule_one.go,
// evaluateNominatedNode). The preferred term alone is only scored when
// kube-scheduler looks at the node at all: past 100 nodes it stops
// filtering once it found percentageOfNodesToScore of them feasible
// (about half of 200 nodes, a tenth of 5,000), and then scores only those.
func (c *Controller) nominate(ctx context.Context, pod *corev1.Pod, node string) (*corev1.Pod, error) {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   map[string]any{"nominatedNodeName": node},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the nomination of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	out, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	if err != nil {
		return nil, fmt.Errorf("nominating node %s for pod %s/%s: %w", node, pod.Namespace, pod.Name, err)
	}
	return out, nil
}

// preferredNodeTerm prefers the node by name, as a claim allocation's node
// selector names its node (planner.NodeSelectorFor).
func preferredNodeTerm(node string) corev1.PreferredSchedulingTerm {
	return corev1.PreferredSchedulingTerm{Weight: preferredNodeWeight, Preference: planner.NodeSelectorFor(node).NodeSelectorTerms[0]}
}

// preferencePatch is the JSON patch that removes gpulink's gate from pod
// and, when node is set, appends the preferred term for it to the pod's
// node affinity; nil when the pod no longer carries the gate. "add"
// creates only the missing level of spec.affinity.nodeAffinity, so that
// the pod's own terms stay.
func preferencePatch(pod *corev1.Pod, node string) ([]byte, error) {
	i := gateIndex(pod)
	if i < 0 {
		return nil, nil
	}
	gatePath := fmt.Sprintf("/spec/schedulingGates/%d", i)
	ops := []jsonPatchOp{
		{Op: "test", Path: "/metadata/uid", Value: string(pod.UID)},
		{Op: "test", Path: gatePath + "/name", Value: driver.SchedulingGate},
	}
	if pod.ResourceVersion != "" {
		ops = append(ops, jsonPatchOp{Op: "test", Path: "/metadata/resourceVersion", Value: pod.ResourceVersion})
	}
	if node != "" {
		term := preferredNodeTerm(node)
		terms := []corev1.PreferredSchedulingTerm{term}
		a := pod.Spec.Affinity
		switch {
		case a == nil:
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/affinity",
				Value: corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: terms}}})
		case a.NodeAffinity == nil:
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/affinity/nodeAffinity",
				Value: corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: terms}})
		case len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0:
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution", Value: terms})
		default:
			ops = append(ops, jsonPatchOp{Op: "add", Path: "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-", Value: term})
		}
	}
	ops = append(ops, jsonPatchOp{Op: "remove", Path: gatePath})
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding the gate removal patch of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return b, nil
}

// hostPodObserved drops the assumption of an ungated pod without claims
// that kube-scheduler found unschedulable: it counts nowhere until bound.
func (c *Controller) hostPodObserved(pod *corev1.Pod) {
	if !c.placeCPUPods || pod.Spec.NodeName != "" || len(pod.Spec.ResourceClaims) > 0 || gateIndex(pod) >= 0 {
		return
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
			c.fit.Unassume(pod.UID)
			return
		}
	}
}
