package planner

import (
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
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
	rejectReserved    = "node(s) reserved for a gang that waited too long"
)

// NodeGetter reads Node objects by name; the controller's Node lister is one.
type NodeGetter interface {
	Get(name string) (*corev1.Node, error)
}

// ClassLister lists DeviceClasses; the controller's DeviceClass lister is one.
type ClassLister interface {
	List(selector labels.Selector) ([]*resourceapi.DeviceClass, error)
}

// NodeFilter selects the nodes a pod could run on, so that the controller
// does not allocate on a node kube-scheduler would then refuse: the node
// must exist and be schedulable, match the pod's nodeSelector and required
// node affinity, carry no NoSchedule/NoExecute taint the pod does not
// tolerate, match the node selectors of the pod's claims that are already
// allocated (by anyone), not be excluded for this pod, have room for the
// pod's CPU, memory, ephemeral storage, extended resources and pod count,
// have none of the pod's host ports in use (ports.go), and satisfy the
// pod's required pod (anti-)affinity (see fitTracker).
type NodeFilter struct {
	Nodes   NodeGetter
	Classes ClassLister
	Fit     *FitTracker
	// Allocatable is read by ranking by stranding (stranding.go).
	Allocatable allocatableMemo
	// Reserved, when set, says why the node is held off for the pod
	// ("" when it is not): the controller's starvation policy reserves
	// a domain for a gang that waited too long.
	Reserved func(pod *corev1.Pod, node string) string
}

// labelsOf returns a node's labels, nil when the node is unknown.
func (f *NodeFilter) labelsOf(name string) map[string]string {
	n, err := f.Nodes.Get(name)
	if err != nil {
		return nil
	}
	return n.Labels
}

// mappedByDRA tells whether a DeviceClass serves the extended resource
// (DRA extended resources: kube-scheduler's DRA plugin allocates it on
// nodes that do not advertise it).
func (f *NodeFilter) mappedByDRA(name corev1.ResourceName) bool {
	if f.Classes == nil {
		return false
	}
	classes, err := f.Classes.List(labels.Everything())
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

// Candidates returns the usable node inventories for the pod and, for
// the waiting message, which filter rejected how many of the others.
func (f *NodeFilter) Candidates(logger klog.Logger, pod *corev1.Pod, all []*NodeInventory, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string]) ([]*NodeInventory, *Rejections) {
	pf := f.forPod(logger, pod, allocated, excluded)
	var out []*NodeInventory
	for _, n := range all {
		if pf.admit(n) {
			out = append(out, n)
		}
	}
	return out, pf.rej
}

// CandidateNodes is Candidates with the Node object of each node admitted
// (parallel to the inventories), for callers that read the nodes' labels
// next (a gang's domains), sparing them a second lookup per node.
func (f *NodeFilter) CandidateNodes(logger klog.Logger, pod *corev1.Pod, all []*NodeInventory, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string]) ([]*NodeInventory, []*corev1.Node, *Rejections) {
	pf := f.forPod(logger, pod, allocated, excluded)
	var out []*NodeInventory
	var objs []*corev1.Node
	for _, n := range all {
		if node, ok := pf.admitNode(n); ok {
			out = append(out, n)
			objs = append(objs, node)
		}
	}
	return out, objs, pf.rej
}

// podFilter is the node filter prepared for one pod: what depends only on
// the pod is computed once, so that admit costs little per node and can
// be asked of only the nodes a decision needs (quickChoice).
type podFilter struct {
	f         *NodeFilter
	logger    klog.Logger
	pod       *corev1.Pod
	affinity  nodeaffinity.RequiredNodeAffinity
	selectors []*nodeaffinity.LazyErrorNodeSelector
	excluded  sets.Set[string]
	fc        *fitCheck
	// rej counts the nodes admit turned down, by reason.
	rej *Rejections
}

// forPod prepares the filter for a pod whose claims listed in allocated
// are already allocated.
func (f *NodeFilter) forPod(logger klog.Logger, pod *corev1.Pod, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string]) *podFilter {
	pf := &podFilter{f: f, logger: logger, pod: pod, affinity: nodeaffinity.GetRequiredNodeAffinity(pod), excluded: excluded, rej: &Rejections{}}
	for _, c := range allocated {
		if c.Status.Allocation != nil && c.Status.Allocation.NodeSelector != nil {
			pf.selectors = append(pf.selectors, nodeaffinity.NewLazyErrorNodeSelector(c.Status.Allocation.NodeSelector))
		}
	}
	if f.Fit != nil {
		pf.fc = f.Fit.check(pod, f.labelsOf)
	}
	return pf
}

func (pf *podFilter) skip(reason, format string, args ...any) bool {
	pf.rej.add(reason)
	pf.rej.detail(format, args...)
	return false
}

// admit tells whether the pod may run on the node, counting the reason in
// rej when not.
func (pf *podFilter) admit(n *NodeInventory) bool {
	_, ok := pf.admitNode(n)
	return ok
}

// admitNode is admit with the node's Node object when admitted.
func (pf *podFilter) admitNode(n *NodeInventory) (*corev1.Node, bool) {
	pod := pf.pod
	if pod.Spec.NodeName != "" && n.Node != pod.Spec.NodeName {
		pf.rej.add(rejectNodeName)
		return nil, false
	}
	if pf.excluded.Has(n.Node) {
		return nil, pf.skip(rejectExcluded, "node %s: the pod was unschedulable there before", n.Node)
	}
	node, err := pf.f.Nodes.Get(n.Node)
	if err != nil {
		return nil, pf.skip(rejectNoNode, "node %s: no Node object", n.Node)
	}
	if pod.Spec.NodeName == "" {
		if node.Spec.Unschedulable {
			return nil, pf.skip(rejectCordoned, "node %s: cordoned", n.Node)
		}
		if ok, err := pf.affinity.Match(node); err != nil || !ok {
			return nil, pf.skip(rejectAffinity, "node %s: does not match the pod's node selector or affinity", n.Node)
		}
		if t, bad := corev1helpers.FindMatchingUntoleratedTaint(pf.logger, node.Spec.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false); bad {
			return nil, pf.skip(rejectTaint, "node %s: taint %s=%s:%s not tolerated by the pod", n.Node, t.Key, t.Value, t.Effect)
		}
	}
	for _, s := range pf.selectors {
		if m, err := s.Match(node); err != nil || !m {
			return nil, pf.skip(rejectOtherClaims, "node %s: another claim of the pod is already allocated elsewhere", n.Node)
		}
	}
	if pf.fc != nil && pod.Spec.NodeName == "" {
		if reason := pf.fc.reject(node, pf.f.mappedByDRA); reason != "" {
			return nil, pf.skip(reason, "node %s: %s", n.Node, reason)
		}
	}
	// Last, so that only a node the pod could otherwise run on counts as
	// held off by a reservation: the waiting message then names the real
	// reason for the others, and a decision is tried past a soft
	// reservation (Decision.HeldOffByReservation) only when the reserved
	// nodes could take the pod.
	if pf.f.Reserved != nil && pod.Spec.NodeName == "" {
		if why := pf.f.Reserved(pod, n.Node); why != "" {
			return nil, pf.skip(rejectReserved, "node %s: %s", n.Node, why)
		}
	}
	return node, true
}

// NodeSelectorFor is the allocation's node selector, as kube-scheduler's
// structured allocator writes it for node-local devices: one term with
// matchFields metadata.name In [node].
func NodeSelectorFor(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}
