package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
)

// ExcludedNodesAnnotation records on a pod the nodes kube-scheduler could
// not place it on after the controller allocated its claims there (comma-
// separated node names), so that a restarted controller (or the next
// leader) does not allocate on them again. The chart's admission policy
// lets the controller write annotations under gpu.gpulink.dev/ on pods and
// nothing else. A pod's creator can set it too, which only narrows the
// pod's own choice of nodes.
const ExcludedNodesAnnotation = "gpu.gpulink.dev/excluded-nodes"

// parseExcluded reads the annotation's node names.
func parseExcluded(pod *corev1.Pod) sets.Set[string] {
	out := sets.New[string]()
	for _, n := range strings.Split(pod.Annotations[ExcludedNodesAnnotation], ",") {
		if n = strings.TrimSpace(n); n != "" {
			out.Insert(n)
		}
	}
	return out
}

// loadExcludedLocked returns the pod's in-memory exclusions, initialised
// from its annotation the first time. c.mu must be held.
func (c *Controller) loadExcludedLocked(pod *corev1.Pod) sets.Set[string] {
	s, ok := c.excluded[pod.UID]
	if !ok {
		s = parseExcluded(pod)
		c.excluded[pod.UID] = s
	}
	return s
}

// excludedNodes returns the nodes excluded for the pod.
func (c *Controller) excludedNodes(pod *corev1.Pod) sets.Set[string] {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loadExcludedLocked(pod).Clone()
}

// exclude adds a node to the pod's exclusions; persistExcluded writes them
// to the pod (syncPod does on the pod's next sync).
func (c *Controller) exclude(pod *corev1.Pod, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loadExcludedLocked(pod).Insert(node)
}

// resetExcluded clears the pod's exclusions; the annotation is removed on
// the pod's next sync (no API call under the decision lock).
func (c *Controller) resetExcluded(ctx context.Context, pod *corev1.Pod) {
	c.mu.Lock()
	c.excluded[pod.UID] = sets.New[string]()
	c.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Every node was excluded for the pod; trying them all again")
	c.podQueue.Add(pod.Namespace + "/" + pod.Name)
}

// persistExcluded makes the pod's annotation say what the controller
// remembers, with a merge patch of that one annotation (nothing when they
// agree, the usual case).
func (c *Controller) persistExcluded(ctx context.Context, pod *corev1.Pod) error {
	c.mu.Lock()
	s, ok := c.excluded[pod.UID]
	var want []string
	if ok {
		want = sets.List(s)
	}
	c.mu.Unlock()
	if !ok || slices.Equal(want, sets.List(parseExcluded(pod))) {
		return nil
	}
	var value any // null removes the annotation
	if len(want) > 0 {
		value = strings.Join(want, ",")
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID, // fails the patch if the pod was replaced
		"annotations": map[string]any{ExcludedNodesAnnotation: value},
	}})
	if err != nil {
		return fmt.Errorf("encoding annotation patch: %w", err)
	}
	_, err = c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("recording excluded nodes %v in annotation %s of pod %s/%s: %w", want, ExcludedNodesAnnotation, pod.Namespace, pod.Name, err)
	}
	return nil
}
