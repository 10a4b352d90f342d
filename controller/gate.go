package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/driver"
)

// gateIndex returns the position of gpulink's scheduling gate, or -1.
func gateIndex(pod *corev1.Pod) int {
	for i, g := range pod.Spec.SchedulingGates {
		if g.Name == driver.SchedulingGate {
			return i
		}
	}
	return -1
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// ungating remembers the pods whose gate this controller has removed or is
// removing, until the pod is deleted (a gate cannot come back: gates can
// only be removed after creation). The claim updates of a decision bring
// its pod back to a worker, often from a cache that still shows the gate;
// without this, that worker would send a second patch, which can only fail
// its test, and a read: two more requests per allocation.
type ungating struct {
	mu   sync.Mutex
	pods sets.Set[types.UID]
}

func newUngating() *ungating { return &ungating{pods: sets.New[types.UID]()} }

// start claims the pod's gate removal; false when it is under way or done.
func (u *ungating) start(uid types.UID) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pods.Has(uid) {
		return false
	}
	u.pods.Insert(uid)
	return true
}

// has tells whether the pod's gate removal is under way or done.
func (u *ungating) has(uid types.UID) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.pods.Has(uid)
}

func (u *ungating) done(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.pods.Delete(uid)
}

// handedOver tells whether the pod is kube-scheduler's to place: its
// gate is gone from the cached pod, or this controller removed it and the
// cache has not caught up yet.
func (c *Controller) handedOver(pod *corev1.Pod) bool {
	return gateIndex(pod) < 0 || c.ungating.has(pod.UID)
}

// ungate removes the pod's gate unless a removal is under way or done and
// not yet seen by the informer; a failed removal is forgotten, so that the
// pod's retry sends it again.
func (c *Controller) ungate(ctx context.Context, pod *corev1.Pod) error {
	if !c.ungating.start(pod.UID) {
		return nil
	}
	err := c.removeGate(ctx, pod)
	if err != nil {
		c.ungating.done(pod.UID)
	}
	return err
}

// removeGate removes gpulink's scheduling gate from the pod, handing it to
// kube-scheduler. The JSON patch tests the gate's name at its index first,
// so a concurrent change to the gate list fails the patch instead of
// removing someone else's gate. A pod that is gone or no longer carries the
// gate needs nothing.
func (c *Controller) removeGate(ctx context.Context, pod *corev1.Pod) error {
	return c.patchPodOrFresh(ctx, pod, c.patchGate)
}

// patchPodOrFresh applies patch, a JSON patch that tests what it relies
// on, to the pod as the cache has it, and once more to the pod as the API
// server has it when that fails: the cached pod may be stale (the gate
// moved or is already gone, so the patch's test failed). A pod gone or
// replaced (another UID) meanwhile needs nothing.
func (c *Controller) patchPodOrFresh(ctx context.Context, pod *corev1.Pod, patch func(context.Context, *corev1.Pod) error) error {
	err := patch(ctx, pod)
	if err == nil || ctx.Err() != nil {
		return err
	}
	fresh, getErr := c.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(getErr) {
		return nil
	}
	if getErr != nil {
		return fmt.Errorf("%w (re-reading the pod: %w)", err, getErr)
	}
	if fresh.UID != pod.UID {
		return nil
	}
	return patch(ctx, fresh)
}

func (c *Controller) patchGate(ctx context.Context, pod *corev1.Pod) error {
	i := gateIndex(pod)
	if i < 0 {
		return nil
	}
	path := fmt.Sprintf("/spec/schedulingGates/%d", i)
	patch, err := json.Marshal([]jsonPatchOp{
		{Op: "test", Path: "/metadata/uid", Value: string(pod.UID)},
		{Op: "test", Path: path + "/name", Value: driver.SchedulingGate},
		{Op: "remove", Path: path},
	})
	if err != nil {
		return fmt.Errorf("encoding gate removal patch: %w", err)
	}
	_, err = c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing scheduling gate %s from pod %s/%s: %w", driver.SchedulingGate, pod.Namespace, pod.Name, err)
	}
	c.metrics.GateWait.Observe(time.Since(pod.CreationTimestamp.Time).Seconds())
	return nil
}
