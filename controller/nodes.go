package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// nodeFilter selects the nodes a pod could run on, so that the controller
// does not allocate on a node kube-scheduler would then refuse: the node
// must exist and be schedulable, match the pod's nodeSelector and required
// node affinity, carry no NoSchedule/NoExecute taint the pod does not
// tolerate, match the node selectors of the pod's claims that are already
// allocated (by anyone), and not be excluded for this pod.
type nodeFilter struct {
	nodes corelisters.NodeLister
}

// candidates returns the usable node inventories for the pod and, for
// the waiting message, why other nodes with gpulink devices were skipped.
func (f *nodeFilter) candidates(logger klog.Logger, pod *corev1.Pod, all []*nodeInventory, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string]) ([]*nodeInventory, []string) {
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var selectors []*nodeaffinity.LazyErrorNodeSelector
	for _, c := range allocated {
		if c.Status.Allocation != nil && c.Status.Allocation.NodeSelector != nil {
			selectors = append(selectors, nodeaffinity.NewLazyErrorNodeSelector(c.Status.Allocation.NodeSelector))
		}
	}
	var out []*nodeInventory
	var why []string
	skip := func(format string, args ...any) {
		if len(why) < 8 {
			why = append(why, fmt.Sprintf(format, args...))
		}
	}
	for _, n := range all {
		if pod.Spec.NodeName != "" && n.Node != pod.Spec.NodeName {
			continue
		}
		if excluded.Has(n.Node) {
			skip("node %s: the pod was unschedulable there before", n.Node)
			continue
		}
		node, err := f.nodes.Get(n.Node)
		if err != nil {
			skip("node %s: no Node object", n.Node)
			continue
		}
		if pod.Spec.NodeName == "" {
			if node.Spec.Unschedulable {
				skip("node %s: cordoned", n.Node)
				continue
			}
			if ok, err := affinity.Match(node); err != nil || !ok {
				skip("node %s: does not match the pod's node selector or affinity", n.Node)
				continue
			}
			if t, bad := corev1helpers.FindMatchingUntoleratedTaint(logger, node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
				return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
			}, false); bad {
				skip("node %s: taint %s=%s:%s not tolerated by the pod", n.Node, t.Key, t.Value, t.Effect)
				continue
			}
		}
		ok := true
		for _, s := range selectors {
			if m, err := s.Match(node); err != nil || !m {
				ok = false
				break
			}
		}
		if !ok {
			skip("node %s: another claim of the pod is already allocated elsewhere", n.Node)
			continue
		}
		out = append(out, n)
	}
	return out, why
}

// nodeSelectorFor is the allocation's node selector, as kube-scheduler's
// structured allocator writes it for node-local devices: one term with
// matchFields metadata.name In [node].
func nodeSelectorFor(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}
