package planner

import (
	"sort"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	resourcehelper "k8s.io/component-helpers/resource"
)

// Reasons a node fails the pod fit filter, worded as kube-scheduler's
// NodeResourcesFit and InterPodAffinity plugins word them, so that the
// waiting event reads like kube-scheduler's FailedScheduling message.
const (
	fitTooManyPods         = "Too many pods"
	fitInsufficientPrefix  = "Insufficient "
	fitAffinityMismatch    = "node(s) didn't match pod affinity rules"
	fitAntiAffinity        = "node(s) didn't match pod anti-affinity rules"
	fitExistingAntiAffnity = "node(s) didn't satisfy existing pods anti-affinity rules"
)

// demand is what a pod asks of a node, as kube-scheduler's NodeResourcesFit
// computes it (k8s.io/component-helpers/resource.PodRequests: the larger of
// the regular containers' sum and each init container's request, sidecars
// added, pod overhead added, pod-level resources where set). CPU is in
// millicores, everything else in units.
type demand map[corev1.ResourceName]int64

// podDemand computes a pod's demand. Resources kube-scheduler does not fit
// (native resources other than cpu, memory, ephemeral-storage and
// hugepages) are dropped.
func podDemand(pod *corev1.Pod) demand {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{UseStatusResources: true})
	out := make(demand, len(reqs))
	for name, q := range reqs {
		if !fitted(name) {
			continue
		}
		v := q.Value()
		if name == corev1.ResourceCPU {
			v = q.MilliValue()
		}
		if v != 0 {
			out[name] = v
		}
	}
	return out
}

// fitted tells whether kube-scheduler's NodeResourcesFit checks a resource.
func fitted(name corev1.ResourceName) bool {
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
		return true
	}
	s := string(name)
	if strings.HasPrefix(s, corev1.ResourceHugePagesPrefix) {
		return true
	}
	// Extended resources: a domain-qualified name outside kubernetes.io
	// (and not a quota name).
	return strings.Contains(s, "/") && !strings.Contains(s, corev1.ResourceDefaultNamespacePrefix) && !strings.HasPrefix(s, corev1.DefaultResourceRequestsPrefix)
}

// fitPod is one pod counted on a node.
type fitPod struct {
	node   string
	ns     string
	labels map[string]string
	demand demand
	// ports are the host ports it takes on the node (ports.go).
	ports []hostPort
	// anti are the pod's required anti-affinity terms, compiled once, kept
	// to check the pods that come after it (kube-scheduler checks them
	// both ways).
	anti []termMatcher
	// bound is set when node comes from spec.nodeName; otherwise the node
	// is the one the controller allocated the pod's claims on, where
	// kube-scheduler will bind it.
	bound bool
}

// nodeUse sums the pods counted on one node.
type nodeUse struct {
	pods      int
	requested demand
	ports     portUse
	members   map[types.UID]*fitPod
}

// FitTracker keeps, per node, what the pods on it request, updated
// incrementally from the pod informer (never recomputed over all pods per
// decision). A pod counts on a node once bound there; before that, from the
// moment the controller decides to allocate its claims on the node, because
// kube-scheduler can only bind it there: two pods decided on one node in
// quick succession must not both be let through on the same free CPUs.
// Finished pods (Succeeded, Failed) do not count, as their resources are
// free again.
type FitTracker struct {
	mu    sync.Mutex
	pods  map[types.UID]*fitPod
	Nodes map[string]*nodeUse
	// withAnti are the counted pods with required anti-affinity terms.
	withAnti map[types.UID]*fitPod
	// HostChanged, when set, is told of every node whose requested CPU or
	// memory changes (ranking by stranding keeps scores per node until
	// then). Called with mu held.
	HostChanged func(node string)
}

func NewFitTracker() *FitTracker {
	return &FitTracker{pods: map[types.UID]*fitPod{}, Nodes: map[string]*nodeUse{}, withAnti: map[types.UID]*fitPod{}}
}

func (f *FitTracker) setLocked(uid types.UID, p *fitPod) {
	if f.HostChanged != nil {
		if old := f.pods[uid]; old != nil && old.demand.countsOnHost() {
			defer f.HostChanged(old.node)
		}
		if p != nil && p.demand.countsOnHost() {
			defer f.HostChanged(p.node)
		}
	}
	if old := f.pods[uid]; old != nil {
		u := f.Nodes[old.node]
		u.pods--
		for name, v := range old.demand {
			u.requested[name] -= v
			if u.requested[name] == 0 {
				delete(u.requested, name)
			}
		}
		u.ports.add(old.ports, -1)
		delete(u.members, uid)
		if u.pods == 0 {
			delete(f.Nodes, old.node)
		}
		delete(f.pods, uid)
		delete(f.withAnti, uid)
	}
	if p == nil {
		return
	}
	u := f.Nodes[p.node]
	if u == nil {
		u = &nodeUse{requested: demand{}, ports: portUse{}, members: map[types.UID]*fitPod{}}
		f.Nodes[p.node] = u
	}
	u.pods++
	for name, v := range p.demand {
		u.requested[name] += v
	}
	u.ports.add(p.ports, 1)
	u.members[uid] = p
	f.pods[uid] = p
	if len(p.anti) > 0 {
		f.withAnti[uid] = p
	}
}

func newFitPod(pod *corev1.Pod, node string, bound bool) *fitPod {
	p := &fitPod{node: node, ns: pod.Namespace, labels: pod.Labels, demand: podDemand(pod), ports: podHostPorts(pod), bound: bound}
	for _, term := range requiredAntiAffinity(pod) {
		if m, ok := compileTerm(term, pod.Namespace); ok {
			p.anti = append(p.anti, m)
		}
	}
	return p
}

// Observe records the informer's view of a pod.
func (f *FitTracker) Observe(pod *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case PodDone(pod):
		f.setLocked(pod.UID, nil)
	case pod.Spec.NodeName != "":
		if old := f.pods[pod.UID]; old != nil && old.bound && old.node == pod.Spec.NodeName && sameLabels(old.labels, pod.Labels) {
			// Status updates of a running pod: nothing that counts changed
			// (a resize shows up in the demand, so recompute it then).
			if d := podDemand(pod); demandEqual(d, old.demand) {
				return
			}
		}
		f.setLocked(pod.UID, newFitPod(pod, pod.Spec.NodeName, true))
	default:
		// Unbound: an assumption of ours stays until the pod is bound or
		// the allocation is released.
	}
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func demandEqual(a, b demand) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Forget drops a pod that is gone.
func (f *FitTracker) Forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setLocked(uid, nil)
}

// Assume counts an unbound pod on the node its claims are allocated on.
func (f *FitTracker) Assume(pod *corev1.Pod, node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.pods[pod.UID]; old != nil && (old.bound || old.node == node) {
		return
	}
	f.setLocked(pod.UID, newFitPod(pod, node, false))
}

// Unassume drops the assumption for an unbound pod whose allocation was
// released or never written.
func (f *FitTracker) Unassume(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.pods[uid]; old != nil && !old.bound {
		f.setLocked(uid, nil)
	}
}

// fitCheck is one pod's fit evaluation over the nodes of one decision:
// its demand and its pod (anti-)affinity terms resolved to the topology
// domains they allow or forbid, computed once per decision.
type fitCheck struct {
	t      *FitTracker
	uid    types.UID
	demand demand
	ports  []hostPort
	// names are demand's resources in the order they are checked, sorted
	// once per decision rather than once per node.
	names []string
	// affinity: for each term, the topology values holding a matching pod;
	// nil when the pod's affinity is satisfied anywhere (no terms, or no
	// matching pod yet and the pod matches its own terms).
	affinity []termDomains
	// anti: domains the pod's own anti-affinity terms forbid, and those
	// existing pods' terms forbid to it.
	anti, existingAnti []termDomains
}

// check prepares the fit evaluation of a pod.
func (f *FitTracker) check(pod *corev1.Pod, nodeLabelsOf nodeLabels) *fitCheck {
	fc := &fitCheck{t: f, uid: pod.UID, demand: podDemand(pod), ports: podHostPorts(pod)}
	for name := range fc.demand {
		fc.names = append(fc.names, string(name))
	}
	sortResourceNames(fc.names)
	f.mu.Lock()
	defer f.mu.Unlock()
	domains := func(m termMatcher) termDomains {
		d := termDomains{key: m.key, values: sets.New[string]()}
		for node, u := range f.Nodes {
			for uid, p := range u.members {
				if uid == pod.UID || !m.matches(p.ns, p.labels) {
					continue
				}
				if v, ok := nodeLabelsOf(node)[m.key]; ok {
					d.values.Insert(v)
				}
				break
			}
		}
		return d
	}
	var affinity []termDomains
	anyMatch, selfMatch := false, true
	for _, term := range requiredAffinity(pod) {
		m, ok := compileTerm(term, pod.Namespace)
		if !ok {
			continue
		}
		d := domains(m)
		anyMatch = anyMatch || d.values.Len() > 0
		selfMatch = selfMatch && m.matches(pod.Namespace, pod.Labels)
		affinity = append(affinity, d)
	}
	// As kube-scheduler: the first pod of a group whose terms select
	// itself may go anywhere.
	if anyMatch || !selfMatch {
		fc.affinity = affinity
	}
	for _, term := range requiredAntiAffinity(pod) {
		if m, ok := compileTerm(term, pod.Namespace); ok {
			fc.anti = append(fc.anti, domains(m))
		}
	}
	for uid, p := range f.withAnti {
		if uid == pod.UID {
			continue
		}
		for _, m := range p.anti {
			if !m.matches(pod.Namespace, pod.Labels) {
				continue
			}
			if v, ok := nodeLabelsOf(p.node)[m.key]; ok {
				fc.existingAnti = append(fc.existingAnti, termDomains{key: m.key, values: sets.New(v)})
			}
		}
	}
	return fc
}

// reject returns why the pod does not fit the node ("" when it fits):
// allocatable minus what the pods counted there request, then the pod
// (anti-)affinity domains. mappedByDRA tells which extended resources a
// DeviceClass serves (kube-scheduler's DRA plugin, not NodeResourcesFit,
// handles those when the node does not advertise them).
func (fc *fitCheck) reject(node *corev1.Node, mappedByDRA func(corev1.ResourceName) bool) string {
	fc.t.mu.Lock()
	u := fc.t.Nodes[node.Name]
	var pods int
	var requested demand
	var used portUse
	var own []hostPort
	if u != nil {
		pods, requested, used = u.pods, u.requested, u.ports
		if self, ok := u.members[fc.uid]; ok {
			pods--
			requested = subtractDemand(requested, self.demand)
			own = self.ports
		}
	}
	reason := fc.resourcesLocked(node, pods, requested, mappedByDRA)
	if reason == "" && portsConflict(used, fc.ports, own) {
		reason = fitPortsConflict
	}
	fc.t.mu.Unlock()
	if reason != "" {
		return reason
	}
	for _, d := range fc.affinity {
		if v, ok := node.Labels[d.key]; !ok || !d.values.Has(v) {
			return fitAffinityMismatch
		}
	}
	for _, d := range fc.anti {
		if v, ok := node.Labels[d.key]; ok && d.values.Has(v) {
			return fitAntiAffinity
		}
	}
	for _, d := range fc.existingAnti {
		if v, ok := node.Labels[d.key]; ok && d.values.Has(v) {
			return fitExistingAntiAffnity
		}
	}
	return ""
}

func subtractDemand(a, b demand) demand {
	out := make(demand, len(a))
	for k, v := range a {
		out[k] = v - b[k]
	}
	return out
}

// resourcesLocked is kube-scheduler's NodeResourcesFit check: the pod
// count, then every resource the pod requests, in a fixed order so that
// the reason is stable.
func (fc *fitCheck) resourcesLocked(node *corev1.Node, pods int, requested demand, mappedByDRA func(corev1.ResourceName) bool) string {
	alloc := node.Status.Allocatable
	if q, ok := alloc[corev1.ResourcePods]; ok && int64(pods+1) > q.Value() {
		return fitTooManyPods
	}
	for _, s := range fc.names {
		name := corev1.ResourceName(s)
		want := fc.demand[name]
		q, ok := alloc[name]
		if !ok && mappedByDRA != nil && mappedByDRA(name) {
			continue
		}
		have := q.Value()
		if name == corev1.ResourceCPU {
			have = q.MilliValue()
		}
		if have < want+requested[name] {
			return fitInsufficientPrefix + s
		}
	}
	return ""
}

// sortResourceNames orders cpu, memory, ephemeral-storage first (as
// kube-scheduler checks them), then the rest by name.
func sortResourceNames(names []string) {
	rank := func(s string) int {
		switch corev1.ResourceName(s) {
		case corev1.ResourceCPU:
			return 0
		case corev1.ResourceMemory:
			return 1
		case corev1.ResourceEphemeralStorage:
			return 2
		}
		return 3
	}
	sort.Slice(names, func(i, j int) bool {
		if ri, rj := rank(names[i]), rank(names[j]); ri != rj {
			return ri < rj
		}
		return names[i] < names[j]
	})
}

func PodDone(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// requestedOn is the CPU (millicores) and memory the pods counted on a
// node request.
func (f *FitTracker) requestedOn(node string) (cpuMilli, memoryBytes int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if u := f.Nodes[node]; u != nil {
		return u.requested[corev1.ResourceCPU], u.requested[corev1.ResourceMemory]
	}
	return 0, 0
}

// countsOnHost tells whether the demand takes CPU or memory, which ranking
// by stranding counts.
func (d demand) countsOnHost() bool {
	return d[corev1.ResourceCPU] != 0 || d[corev1.ResourceMemory] != 0
}
