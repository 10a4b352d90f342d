//go:build e2e

package conformance_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// taintCases run the example driver's DeviceTaintRule scenarios (numbered
// files, applied in order) and Kubernetes' rule example. A rule taints
// every gpulink device, so each runs alone; the port changes the rule's
// deviceSelector.driver (and its apiVersion v1beta2 → v1, where the rule
// is GA in 1.37). They check that gpulink's allocator honours rules and
// tolerations as kube-scheduler does, and that tainted devices' pods are
// evicted (by kube-controller-manager) unless they tolerate.
func taintCases() []*peerCase {
	const d = "dra-example-driver/device-taints-tolerations/"
	const ns = "basic-resourceclaimtemplate"
	noSchedule := &peerCase{alone: true, gpus: 2,
		files: []string{d + "device-taint-pod-noschedule/1-basic-resourceclaimtemplate.yaml", d + "device-taint-pod-noschedule/2-pod-keeps-running.yaml",
			d + "device-taint-pod-noschedule/3-device-taint-rule.yaml", d + "device-taint-pod-noschedule/4-pod-not-scheduled.yaml"},
		note: "class, rule `driver: gpu.gpulink.dev`; NoSchedule: the running pod stays, the new pod waits with WaitingForGPUs",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.waitPod(ctx, t, ns, "pod-keeps-running")
			r.applyRule(ctx, t, r.c.files[2])
			r.applyFile(ctx, t, r.c.files[3])
			r.waitWaiting(ctx, t, ns, "pod-no-schedule")
			r.waitPod(ctx, t, ns, "pod-keeps-running")
			return ""
		}}
	noSchedule.applyLater = map[string]bool{noSchedule.files[2]: true, noSchedule.files[3]: true}
	noExecute := &peerCase{alone: true, gpus: 2,
		files: []string{d + "device-taint-pod-noexecute/1-basic-resourceclaimtemplate.yaml", d + "device-taint-pod-noexecute/2-pod-to-be-evicted.yaml",
			d + "device-taint-pod-noexecute/3-device-taint-rule.yaml", d + "device-taint-pod-noexecute/4-pod-no-execute.yaml"},
		note: "class, rule `driver: gpu.gpulink.dev`; NoExecute: the running pod is evicted, the new pod waits",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.waitPod(ctx, t, ns, "pod-to-be-evicted")
			r.applyRule(ctx, t, r.c.files[2])
			r.waitEvicted(ctx, t, ns, "pod-to-be-evicted")
			r.applyFile(ctx, t, r.c.files[3])
			r.waitWaiting(ctx, t, ns, "pod-no-execute")
			return ""
		}}
	noExecute.applyLater = map[string]bool{noExecute.files[2]: true, noExecute.files[3]: true}
	toleration := &peerCase{alone: true, gpus: 1,
		files: []string{d + "device-taint-pod-toleration/1-device-taint-rule.yaml", d + "device-taint-pod-toleration/2-basic-resourceclaimtemplate.yaml"},
		note:  "class, rule `driver: gpu.gpulink.dev`; the tolerating pod runs on a tainted GPU, the other waits",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.waitPod(ctx, t, ns, "pod-with-toleration")
			r.waitWaiting(ctx, t, ns, "pod-without-toleration")
			return ""
		}}
	toleration.applyLater = map[string]bool{toleration.files[0]: true, toleration.files[1]: true}
	toleration.before = func(ctx context.Context, t *testing.T, r *run) {
		r.applyRule(ctx, t, toleration.files[0])
		r.applyFile(ctx, t, toleration.files[1])
	}
	eviction := &peerCase{alone: true, gpus: 3,
		files: []string{d + "device-taint-configurable-pod-eviction-time/1-basic-resourceclaimtemplate.yaml", d + "device-taint-configurable-pod-eviction-time/2-device-taint-rule.yaml"},
		note:  "class, rule `driver: gpu.gpulink.dev`; NoExecute evicts the pod without toleration, the tolerating pods keep running (the 300 s one is not waited for)",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.waitRunning(ctx, t, ns, 3)
			r.applyRule(ctx, t, r.c.files[1])
			r.waitEvicted(ctx, t, ns, "pod-no-toleration")
			r.waitPod(ctx, t, ns, "pod-with-toleration")
			r.waitPod(ctx, t, ns, "pod-with-300s-toleration")
			return ""
		}}
	eviction.applyLater = map[string]bool{eviction.files[1]: true}
	const k = "kubernetes-e2e-dra/test-driver-examples/"
	k8s := &peerCase{alone: true, gpus: 1,
		files: []string{k + "pod-external-toleration.yaml", k + "devicetaintrule.yaml"},
		note:  "class, rule `driver: gpu.gpulink.dev`; the pod tolerating the NoExecute taint keeps running on its tainted GPU",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.waitPod(ctx, t, r.ns, "test-external-claim")
			r.applyRule(ctx, t, r.c.files[1])
			time.Sleep(5 * time.Second) // what an eviction would take
			r.waitPod(ctx, t, r.ns, "test-external-claim")
			return ""
		}}
	k8s.applyLater = map[string]bool{k8s.files[1]: true}
	return []*peerCase{noSchedule, noExecute, toleration, eviction, k8s}
}

// applyRule applies a DeviceTaintRule file and gives gpulink's controller
// and kube-controller-manager a moment to see it (a rule has no status
// that says it is in effect).
func (r *run) applyRule(ctx context.Context, t *testing.T, file string) {
	t.Helper()
	r.applyFile(ctx, t, file)
	if len(r.refused) > 0 {
		t.Fatalf("%s: refused: %v", file, r.refused[len(r.refused)-1].err)
	}
	time.Sleep(3 * time.Second)
}

// waitEvicted waits until the pod is gone or failed (evicted for its
// tainted device).
func (r *run) waitEvicted(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	var phase corev1.PodPhase
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := r.e.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		t.Fatalf("%s: pod %s/%s not evicted (phase %s): %v\n%s", r.c.files[0], ns, name, phase, err, r.describe(ctx, ns))
	}
	t.Logf("pod %s/%s evicted", ns, name)
}
