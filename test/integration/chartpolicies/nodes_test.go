//go:build integration

package chartpolicies_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/steer"
)

// nodePolicy holds the controller's node updates to its steering taint.
const nodePolicy = release + "-controller-nodes"

// testControllerNodePolicy: the controller's role may patch nodes, and
// the ValidatingAdmissionPolicy <release>-controller-nodes lets through
// exactly the patches controller/steer sends, adding and removing the
// PreferNoSchedule taints gpu.gpulink.dev/free-gpus and
// gpu.gpulink.dev/scarce-gpus, with the node's other taints kept; it
// refuses those keys with another effect or a value, a second copy,
// another key, and changes of labels, annotations or other spec fields,
// which RBAC alone would allow; other identities are not its business.
func (e *env) testControllerNodePolicy(t *testing.T) {
	ctx := e.ctx
	const name = "node-b"
	nodes := e.controller.CoreV1().Nodes()
	patch := func(pt types.PatchType, body string) error {
		return errOf(nodes.Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{}))
	}
	e.poll(t, "the ValidatingAdmissionPolicy "+nodePolicy+" to take effect", func() bool {
		return errOf(nodes.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"probe":"1"}}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})) != nil
	})
	// Another component's taint, which must survive.
	other := corev1.Taint{Key: "example.com/dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	if _, err := e.admin.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType,
		[]byte(fmt.Sprintf(`[{"op":"add","path":"/spec/taints","value":[{"key":%q,"value":%q,"effect":%q}]}]`, other.Key, other.Value, other.Effect)),
		metav1.PatchOptions{}); err != nil {
		t.Fatalf("tainting %s (admin): %v", name, err)
	}
	// steerPatch is the patch controller/steer sends for the node as it is.
	steerPatch := func(taint corev1.Taint, add bool) string {
		n, err := e.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := steer.Patch(n, taint, add)
		if err != nil || p == nil {
			t.Fatalf("steer.Patch(%s, add=%v) on %v: %s, %v", taint.Key, add, n.Spec.Taints, p, err)
		}
		return string(p)
	}
	taint := func(key, value string, effect corev1.TaintEffect) string {
		return fmt.Sprintf(`[{"op":"add","path":"/spec/taints/-","value":{"key":%q,"value":%q,"effect":%q}}]`, key, value, effect)
	}
	for _, c := range []struct {
		what string
		pt   types.PatchType
		body string
	}{
		{"controller taints a node NoSchedule with its key", types.JSONPatchType, taint(steer.TaintKey, "", corev1.TaintEffectNoSchedule)},
		{"controller taints a node NoExecute with its key", types.JSONPatchType, taint(steer.TaintKey, "", corev1.TaintEffectNoExecute)},
		{"controller adds another key's PreferNoSchedule taint", types.JSONPatchType, taint("example.com/other", "", corev1.TaintEffectPreferNoSchedule)},
		{"controller adds its taint with a value", types.JSONPatchType, taint(steer.TaintKey, "8", corev1.TaintEffectPreferNoSchedule)},
		{"controller taints a node NoSchedule with its second key", types.JSONPatchType, taint(steer.ScarceTaintKey, "", corev1.TaintEffectNoSchedule)},
		{"controller adds its second taint with a value", types.JSONPatchType, taint(steer.ScarceTaintKey, "x", corev1.TaintEffectPreferNoSchedule)},
		{"controller removes another component's taint", types.JSONPatchType, `[{"op":"remove","path":"/spec/taints/0"}]`},
		{"controller replaces another component's taint by its own", types.JSONPatchType,
			fmt.Sprintf(`[{"op":"replace","path":"/spec/taints/0","value":{"key":%q,"effect":"PreferNoSchedule"}}]`, steer.TaintKey)},
		{"controller changes a node's label", types.MergePatchType, `{"metadata":{"labels":{"nvidia.com/gpu.present":"false"}}}`},
		{"controller annotates a node", types.MergePatchType, `{"metadata":{"annotations":{"gpu.gpulink.dev/note":"x"}}}`},
		{"controller cordons a node", types.MergePatchType, `{"spec":{"unschedulable":true}}`},
		{"controller sets a node's podCIDR", types.MergePatchType, `{"spec":{"podCIDR":"10.9.0.0/24"}}`},
		{"controller adds its taint and a label in one patch", types.JSONPatchType,
			fmt.Sprintf(`[{"op":"add","path":"/spec/taints/-","value":{"key":%q,"effect":"PreferNoSchedule"}},{"op":"add","path":"/metadata/labels","value":{"evil":"true"}}]`, steer.TaintKey)},
	} {
		denyBy(t, c.what, nodePolicy, patch(c.pt, c.body))
	}
	allow(t, "controller adds its taint (controller/steer's patch)", patch(types.JSONPatchType, steerPatch(steer.Taint, true)))
	check := func(want []corev1.Taint) {
		t.Helper()
		n, err := e.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(n.Spec.Taints, want, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) {
			t.Errorf("node %s: taints %v, want %v", name, n.Spec.Taints, want)
		}
	}
	check([]corev1.Taint{other, steer.Taint})
	denyBy(t, "controller adds its taint a second time with NoSchedule beside it", nodePolicy,
		patch(types.JSONPatchType, taint(steer.TaintKey, "", corev1.TaintEffectNoSchedule)))
	// A second copy of a taint is refused by the API server's validation
	// (taints are unique by key and effect) before the policy sees it.
	deny(t, "controller adds its taint a second time", patch(types.JSONPatchType, taint(steer.TaintKey, "", corev1.TaintEffectPreferNoSchedule)))
	allow(t, "controller adds its second taint (controller/steer's patch)", patch(types.JSONPatchType, steerPatch(steer.ScarceTaint, true)))
	check([]corev1.Taint{other, steer.Taint, steer.ScarceTaint})
	deny(t, "controller adds its second taint once more", patch(types.JSONPatchType, taint(steer.ScarceTaintKey, "", corev1.TaintEffectPreferNoSchedule)))
	denyBy(t, "controller removes another component's taint beside its second", nodePolicy,
		patch(types.JSONPatchType, `[{"op":"remove","path":"/spec/taints/0"}]`))
	allow(t, "controller removes its first taint, keeping the second (controller/steer's patch)", patch(types.JSONPatchType, steerPatch(steer.Taint, false)))
	check([]corev1.Taint{other, steer.ScarceTaint})
	allow(t, "controller removes its second taint (controller/steer's patch)", patch(types.JSONPatchType, steerPatch(steer.ScarceTaint, false)))
	check([]corev1.Taint{other})
	// The first taint of a node without any: a test of its
	// resourceVersion, then the list. API-only nodes carry the not-ready
	// taint (TaintNodesByCondition), which the admin removes first;
	// kube-controller-manager may put it back in between, which fails the
	// test of the resourceVersion, and the case is tried again.
	e.poll(t, "the controller's first taint on a node without taints", func() bool {
		if _, err := e.admin.CoreV1().Nodes().Patch(ctx, "node-a", types.JSONPatchType,
			[]byte(`[{"op":"remove","path":"/spec/taints"}]`), metav1.PatchOptions{}); err != nil {
			t.Logf("removing node-a's taints (admin): %v", err)
		}
		n, err := e.admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil || len(n.Spec.Taints) != 0 {
			return false
		}
		p, err := steer.Patch(n, steer.Taint, true)
		if err != nil {
			t.Fatal(err)
		}
		err = errOf(nodes.Patch(ctx, "node-a", types.JSONPatchType, p, metav1.PatchOptions{}))
		if err != nil && strings.Contains(err.Error(), nodePolicy) {
			t.Fatalf("denied, want allowed: controller adds its taint to a node without taints: %v", err)
		}
		if err == nil {
			t.Log("ok: allowed: controller adds its taint to a node without taints")
		}
		return err == nil
	})
	allow(t, "controller sends a patch that changes nothing",
		patch(types.JSONPatchType, fmt.Sprintf(`[{"op":"test","path":"/metadata/name","value":%q}]`, name)))
	allow(t, "another identity (admin) still labels and cordons nodes", errOf(e.admin.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"x":"y"}},"spec":{"unschedulable":true}}`), metav1.PatchOptions{})))
	deny(t, "controller writes a node's status (no RBAC for nodes/status)", errOf(nodes.Patch(ctx, name, types.MergePatchType,
		[]byte(`{"status":{"capacity":{"cpu":"1"}}}`), metav1.PatchOptions{}, "status")))
	// Leave node-a as it was for the steps after this one.
	if n, err := e.admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err == nil {
		if p, err := steer.Patch(n, steer.Taint, false); err == nil && p != nil {
			if _, err := e.admin.CoreV1().Nodes().Patch(ctx, "node-a", types.JSONPatchType, p, metav1.PatchOptions{}); err != nil {
				t.Errorf("removing the taint from node-a (admin): %v", err)
			}
		}
	}
}
