package planner

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Pod (anti-)affinity terms as the node fit evaluates them (fitCheck).

func requiredAntiAffinity(pod *corev1.Pod) []corev1.PodAffinityTerm {
	if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		return a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}

func requiredAffinity(pod *corev1.Pod) []corev1.PodAffinityTerm {
	if a := pod.Spec.Affinity; a != nil && a.PodAffinity != nil {
		return a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}

// termDomains are the values of a topology key that hold a matching pod.
type termDomains struct {
	key    string
	values sets.Set[string]
}

// nodeLabels returns a node's labels (nil when unknown).
type nodeLabels func(name string) map[string]string

// termMatcher is a compiled pod affinity term.
type termMatcher struct {
	key string
	sel labels.Selector
	// namespaces: nil means all namespaces.
	namespaces sets.Set[string]
}

// compileTerm compiles a term of a pod in namespace ns. Terms with a
// non-empty namespaceSelector are not evaluated (false): that needs
// namespace labels, and kube-scheduler still checks them.
func compileTerm(term corev1.PodAffinityTerm, ns string) (termMatcher, bool) {
	m := termMatcher{key: term.TopologyKey}
	if term.TopologyKey == "" {
		return m, false
	}
	if term.NamespaceSelector != nil && (len(term.NamespaceSelector.MatchLabels) > 0 || len(term.NamespaceSelector.MatchExpressions) > 0) {
		return m, false
	}
	sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
	if err != nil {
		return m, false
	}
	m.sel = sel
	switch {
	case term.NamespaceSelector != nil:
		// An empty selector: every namespace.
	case len(term.Namespaces) > 0:
		m.namespaces = sets.New(term.Namespaces...)
	default:
		m.namespaces = sets.New(ns)
	}
	return m, true
}

func (m termMatcher) matches(ns string, l map[string]string) bool {
	return (m.namespaces == nil || m.namespaces.Has(ns)) && m.sel.Matches(labels.Set(l))
}
