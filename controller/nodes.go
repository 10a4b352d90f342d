package controller

import (
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Node filter reasons, counted per node for the waiting event; worded as
// kube-scheduler's plugins word theirs where one has the same filter.
const (
	rejectNodeName    = "node(s) didn't match the requested node name"
	rejectExcluded    = "node(s) the pod was unschedulable on before"
	rejectNoNode      = "node(s) without a Node object"
	rejectCordoned    = "node(s) were unschedulable"
	rejectAffinity    = "node(s) didn't match Pod's node affinity/selector"
	rejectTaint       = "node(s) had untolerated taint(s)"
	rejectOtherClaims = "node(s) didn't match the node of the pod's allocated claims"
)

// nodeFilter selects the nodes a pod could run on, so that the controller
// does not allocate on a node kube-scheduler would then refuse: the node
// must exist and be schedulable, match the pod's nodeSelector and required
// node affinity, carry no NoSchedule/NoExecute taint the pod does not
// tolerate, match the node selectors of the pod's claims that are already
// allocated (by anyone), not be excluded for this pod, have room for the
// pod's CPU, memory, ephemeral storage, extended resources and pod count,
// and satisfy the pod's required pod (anti-)affinity (see fitTracker).
type nodeFilter struct {
	nodes   corelisters.NodeLister
	classes resourcelisters.DeviceClassLister
	fit     *fitTracker
}

// labelsOf returns a node's labels, nil when the node is unknown.
func (f *nodeFilter) labelsOf(name string) map[string]string {
	n, err := f.nodes.Get(name)
	if err != nil {
		return nil
	}
	return n.Labels
}

// mappedByDRA tells whether a DeviceClass serves the extended resource
// (DRA extended resources: kube-scheduler's DRA plugin allocates it on
// nodes that do not advertise it).
func (f *nodeFilter) mappedByDRA(name corev1.ResourceName) bool {
	if f.classes == nil {
		return false
	}
	classes, err := f.classes.List(labels.Everything())
	if err != nil {
		return false
	}
	for _, c := range classes {
		if (c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName == string(name)) || string(name) == resourceapi.ResourceDeviceClassPrefix+c.Name {
			return true
		}
	}
	return false
}

// candidates returns the usable node inventories for the pod and, for
// the waiting message, which filter rejected how many of the others.
func (f *nodeFilter) candidates(logger klog.Logger, pod *corev1.Pod, all []*nodeInventory, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string]) ([]*nodeInventory, *rejections) {
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var selectors []*nodeaffinity.LazyErrorNodeSelector
	for _, c := range allocated {
		if c.Status.Allocation != nil && c.Status.Allocation.NodeSelector != nil {
			selectors = append(selectors, nodeaffinity.NewLazyErrorNodeSelector(c.Status.Allocation.NodeSelector))
		}
	}
	var fc *fitCheck
	if f.fit != nil {
		fc = f.fit.check(pod, f.labelsOf)
	}
	var out []*nodeInventory
	rej := &rejections{}
	skip := func(reason, format string, args ...any) {
		rej.add(reason)
		rej.detail(format, args...)
	}
	for _, n := range all {
		if pod.Spec.NodeName != "" && n.Node != pod.Spec.NodeName {
			rej.add(rejectNodeName)
			continue
		}
		if excluded.Has(n.Node) {
			skip(rejectExcluded, "node %s: the pod was unschedulable there before", n.Node)
			continue
		}
		node, err := f.nodes.Get(n.Node)
		if err != nil {
			skip(rejectNoNode, "node %s: no Node object", n.Node)
			continue
		}
		if pod.Spec.NodeName == "" {
			if node.Spec.Unschedulable {
				skip(rejectCordoned, "node %s: cordoned", n.Node)
				continue
			}
			if ok, err := affinity.Match(node); err != nil || !ok {
				skip(rejectAffinity, "node %s: does not match the pod's node selector or affinity", n.Node)
				continue
			}
			if t, bad := corev1helpers.FindMatchingUntoleratedTaint(logger, node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
				return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
			}, false); bad {
				skip(rejectTaint, "node %s: taint %s=%s:%s not tolerated by the pod", n.Node, t.Key, t.Value, t.Effect)
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
			skip(rejectOtherClaims, "node %s: another claim of the pod is already allocated elsewhere", n.Node)
			continue
		}
		if fc != nil && pod.Spec.NodeName == "" {
			if reason := fc.reject(node, f.mappedByDRA); reason != "" {
				skip(reason, "node %s: %s", n.Node, reason)
				continue
			}
		}
		out = append(out, n)
	}
	return out, rej
}

// nodeSelectorFor is the allocation's node selector, as kube-scheduler's
// structured allocator writes it for node-local devices: one term with
// matchFields metadata.name In [node].
func nodeSelectorFor(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}
