//go:build integration

package chartpolicies_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

const (
	// cpuPodsNS opts in to gate.cpuPods by the chart's default label.
	cpuPodsNS    = "cpu-pods-test"
	cpuPodsLabel = "gpu.gpulink.dev/place-cpu-pods"
	cpuPodsGate  = release + "-cpu-pods-gate"
)

// testCPUPods installs the chart with gate.cpuPods.enabled=true over the
// default installation and checks that its policy gates exactly the pods
// without claims of opted-in namespaces (not the release's namespace, not
// DaemonSet pods), that the controller's pod policy lets it append one
// preferred node term in the update that lifts its gate from such a pod,
// and nothing else, and that its status policy lets it set only
// status.nominatedNodeName of such a pod while it is gated. The default installation is restored after.
func (e *env) testCPUPods(t *testing.T) {
	ctx := e.ctx
	if err := e.applyChart(ctx, "--set", "gate.cpuPods.enabled=true"); err != nil {
		t.Fatalf("installing the chart with gate.cpuPods: %v", err)
	}
	t.Cleanup(func() { e.restoreDefaults(t) })
	for _, ns := range []string{cpuPodsNS, chartNS} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, cpuPodsLabel)
		if ns == cpuPodsNS {
			if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{cpuPodsLabel: "true"}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// The release's namespace opted in too: its pods stay ungated.
		if _, err := e.admin.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.poll(t, "the default service account of "+cpuPodsNS, func() bool {
		_, err := e.admin.CoreV1().ServiceAccounts(cpuPodsNS).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	cpuPod := func(ns, name string) *corev1.Pod {
		p := gatePod(name, false, nil, "")
		p.Namespace = ns
		return p
	}
	e.poll(t, "the cpu-pods gate policy to take effect", func() bool {
		p, err := e.admin.CoreV1().Pods(cpuPodsNS).Create(ctx, cpuPod(cpuPodsNS, "probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && slices.Equal(gateNames(p), []string{driver.SchedulingGate})
	})
	daemon := cpuPod(cpuPodsNS, "daemon")
	daemon.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "0b7e4f3a-0000-4000-8000-000000000001"}}
	withClaim := gatePod("with-claim", true, nil, "")
	withClaim.Namespace = cpuPodsNS
	for _, c := range []struct {
		pod  *corev1.Pod
		want []string
	}{
		{cpuPod(cpuPodsNS, "placed"), []string{driver.SchedulingGate}},
		{cpuPod(cpuPodsNS, "own-preference"), []string{driver.SchedulingGate}},
		{withClaim, []string{driver.SchedulingGate}},
		{daemon, nil},
		{cpuPod(gateNS, "not-opted-in"), nil},
		{cpuPod(chartNS, "release-namespace"), nil},
	} {
		got, err := e.admin.CoreV1().Pods(c.pod.Namespace).Create(ctx, c.pod, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("creating pod %s/%s: %v", c.pod.Namespace, c.pod.Name, err)
			continue
		}
		if g := gateNames(got); !slices.Equal(g, c.want) {
			t.Errorf("pod %s/%s: gates %q, want %q", c.pod.Namespace, c.pod.Name, g, c.want)
		} else {
			t.Logf("ok: pod %s/%s: gates %q", c.pod.Namespace, c.pod.Name, g)
		}
	}

	// The controller's pod policy, as rendered with gate.cpuPods.
	e.poll(t, "the controller pod policy to allow the preferred node term", func() bool {
		return patchPod(ctx, e, cpuPodsNS, "placed", liftWithPreference("", 100), true) == nil
	})
	// The nomination before the gate goes (controller/cpupods.go).
	statusPolicy := release + "-controller-pod-status"
	e.poll(t, "the controller pod status policy to take effect", func() bool {
		_, err := e.controller.CoreV1().Pods(cpuPodsNS).Patch(ctx, "placed", types.MergePatchType, []byte(`{"status":{"message":"probe"}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		return err != nil
	})
	allow(t, "controller nominates a node for a gated pod without claims",
		patchStatus(ctx, e, cpuPodsNS, "placed", `{"status":{"nominatedNodeName":"node-a"}}`))
	denyBy(t, "controller changes another status field", statusPolicy,
		patchStatus(ctx, e, cpuPodsNS, "placed", `{"status":{"message":"hello"}}`))
	denyBy(t, "controller nominates a node for a pod with claims", statusPolicy,
		patchStatus(ctx, e, cpuPodsNS, "with-claim", `{"status":{"nominatedNodeName":"node-a"}}`))
	term := func(weight int) string {
		return fmt.Sprintf(`{"weight":%d,"preference":{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-a"]}]}}`, weight)
	}
	for _, c := range []struct{ what, pod, body string }{
		{"controller adds a preferred node term without lifting its gate", "placed",
			fmt.Sprintf(`[{"op":"add","path":"/spec/affinity","value":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[%s]}}}]`, term(100))},
		{"controller lifts its gate with a required node term", "placed",
			`[{"op":"add","path":"/spec/affinity","value":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-a"]}]}]}}}},{"op":"remove","path":"/spec/schedulingGates/0"}]`},
		{"controller lifts its gate with a preferred term of another weight", "placed", liftWithPreference("", 50)},
		{"controller lifts its gate with two preferred terms", "placed",
			fmt.Sprintf(`[{"op":"add","path":"/spec/affinity","value":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[%s,%s]}}},{"op":"remove","path":"/spec/schedulingGates/0"}]`, term(100), term(100))},
		{"controller lifts its gate with a preferred term on node labels", "placed",
			`[{"op":"add","path":"/spec/affinity","value":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":100,"preference":{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}}]}}},{"op":"remove","path":"/spec/schedulingGates/0"}]`},
		{"controller lifts the gate of a pod with claims with a preferred node term", "with-claim", liftWithPreference("", 100)},
	} {
		denyBy(t, c.what, podPolicy, patchPod(ctx, e, cpuPodsNS, c.pod, c.body, false))
	}
	allow(t, "controller lifts its gate with one preferred node term (controller/cpupods.go)",
		patchPod(ctx, e, cpuPodsNS, "placed", liftWithPreference("", 100), false))
	// A pod with a preferred term of its own: gpulink's is appended.
	own := fmt.Sprintf(`{"metadata":{},"spec":{"affinity":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[%s]}}}}`, term(7))
	if _, err := e.admin.CoreV1().Pods(cpuPodsNS).Patch(ctx, "own-preference", types.StrategicMergePatchType, []byte(own), metav1.PatchOptions{}); err != nil {
		t.Fatalf("giving the gated pod a preferred term (admin): %v", err)
	}
	denyBy(t, "controller replaces the pod's own preferred term", podPolicy,
		patchPod(ctx, e, cpuPodsNS, "own-preference", liftWithPreference("", 100), false))
	allow(t, "controller appends its term to the pod's own",
		patchPod(ctx, e, cpuPodsNS, "own-preference", liftWithPreference("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-", 100), false))
	denyBy(t, "controller nominates a node for a pod it already ungated", statusPolicy,
		patchStatus(ctx, e, cpuPodsNS, "placed", `{"status":{"nominatedNodeName":"node-b"}}`))
	for _, name := range []string{"placed", "own-preference"} {
		p, err := e.admin.CoreV1().Pods(cpuPodsNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(gateNames(p)) != 0 || p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
			t.Errorf("pod %s: gates %q, affinity %+v after the controller's patch", name, gateNames(p), p.Spec.Affinity)
		}
	}
}

// liftWithPreference is the controller's patch: gpulink's gate (the pod's
// only one) removed and a preferred node term for node-a of the weight
// added, at path (empty: a new spec.affinity).
func liftWithPreference(path string, weight int) string {
	t := fmt.Sprintf(`{"weight":%d,"preference":{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-a"]}]}}`, weight)
	add := fmt.Sprintf(`{"op":"add","path":"/spec/affinity","value":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[%s]}}}`, t)
	if path != "" {
		add = fmt.Sprintf(`{"op":"add","path":%q,"value":%s}`, path, t)
	}
	return fmt.Sprintf(`[{"op":"test","path":"/spec/schedulingGates/0/name","value":%q},%s,{"op":"remove","path":"/spec/schedulingGates/0"}]`, driver.SchedulingGate, add)
}

// patchPod sends a JSON patch as the controller, as a dry run when dry.
func patchPod(ctx context.Context, e *env, ns, name, body string, dry bool) error {
	opts := metav1.PatchOptions{}
	if dry {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err := e.controller.CoreV1().Pods(ns).Patch(ctx, name, types.JSONPatchType, []byte(body), opts)
	return err
}

// patchStatus sends a merge patch of the pod's status as the controller.
func patchStatus(ctx context.Context, e *env, ns, name, body string) error {
	_, err := e.controller.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status")
	return err
}

// restoreDefaults puts the default installation back: the cpu-pods gate
// policy deleted, the default renderings of the others applied, the
// release namespace's opt-in label removed.
func (e *env) restoreDefaults(t *testing.T) {
	ctx := context.Background()
	_ = e.admin.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Delete(ctx, cpuPodsGate, metav1.DeleteOptions{})
	_ = e.admin.AdmissionregistrationV1().MutatingAdmissionPolicies().Delete(ctx, cpuPodsGate, metav1.DeleteOptions{})
	_ = e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, release+"-controller-pod-status", metav1.DeleteOptions{})
	_ = e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, release+"-controller-pod-status", metav1.DeleteOptions{})
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, cpuPodsLabel)
	_, _ = e.admin.CoreV1().Namespaces().Patch(ctx, chartNS, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err := e.applyChart(ctx); err != nil {
		t.Errorf("restoring the default installation: %v", err)
	}
}

// applyChart renders the chart with helm's extra arguments and applies
// every object it renders, all of them even when one fails (the errors
// joined).
func (e *env) applyChart(ctx context.Context, helmArgs ...string) error {
	rendered, err := localcluster.HelmTemplate(ctx, release, chartNS, helmArgs...)
	if err != nil {
		return fmt.Errorf("rendering the chart: %w", err)
	}
	objs, err := localcluster.DecodeObjects(rendered)
	if err != nil {
		return fmt.Errorf("decoding the rendered chart: %w", err)
	}
	var errs []error
	for _, o := range objs {
		if err := e.apply(o, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
