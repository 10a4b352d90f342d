// Package gangs says which gang a pod belongs to and what the gang asks
// for: how many pods must be placed together (minCount) and the level of
// the cluster's hierarchy its pods must (Required) or should (Preferred)
// share. It reads pods and PodGroups only; the controller keeps the pods
// of a gang gated and decides them together, and driver/gang places them.
//
// A pod is in a gang in one of two ways:
//
//   - It names a PodGroup (spec.schedulingGroup.podGroupName, the Workload
//     API of Kubernetes 1.37, scheduling.k8s.io/v1beta1, feature gate
//     GenericWorkload) whose schedulingPolicy is gang: minCount is the
//     PodGroup's gang.minCount, and its schedulingConstraints.topology key
//     (gate TopologyAwareWorkloadScheduling) is a Required level. A PodGroup
//     with the basic policy makes no gang: its pods are placed one by one.
//   - Without the Workload API, through labels or annotations on the pod
//     (set them in a Job's, JobSet's or LeaderWorkerSet's pod template):
//     LabelGang names the gang (unique per namespace), LabelSize its
//     minCount, and optionally LabelLevel a level (a hierarchy level name
//     or node label key) with LabelPolicy Required (the default when a
//     level is given) or Preferred. Where one pod template serves many
//     gangs (a LeaderWorkerSet's groups, a JobSet's child Jobs), LabelNameFrom
//     names another label of the pod whose value is the gang's name (the
//     group key its controller sets on each group's pods).
//
// A pod that names a PodGroup with the basic policy is in its label gang if
// it has gang labels, and in no gang otherwise (Resolve): Kubernetes
// 1.37's Job controller (feature gate WorkloadWithJob) puts the pods of
// every Job in a basic PodGroup unless the Job's spec.scheduling asks for
// a gang, and that PodGroup says nothing about placing them together.
//
// The gang's pods may set LabelLevel and LabelPolicy in the PodGroup path
// too, for a PodGroup without a topology constraint: a gang can then ask
// for a level of gpulink's hierarchy as Preferred, which the Workload API
// cannot say. A PodGroup's own topology key is Required: kube-scheduler
// enforces it as well, so a pod cannot relax it to Preferred.
package gangs

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
)

// Keys of the labels (or annotations) that make a pod part of a gang
// without the Workload API. A label wins over an annotation of the same key.
const (
	// LabelGang names the pod's gang; pods of one namespace with the same
	// value are one gang.
	LabelGang = "gpu.gpulink.dev/gang"
	// LabelSize is the gang's minCount: how many of its pods must be
	// placed together, a positive integer.
	LabelSize = "gpu.gpulink.dev/gang-size"
	// LabelLevel is the level of the cluster's hierarchy the gang's pods
	// must or should share: a level name of the controller's hierarchy
	// (leaf) or one of its node label keys (network.topology.nvidia.com/leaf,
	// which as a value is valid in an annotation only: label values
	// cannot hold '/').
	LabelLevel = "gpu.gpulink.dev/gang-level"
	// LabelPolicy is Required or Preferred: whether the gang waits until
	// it fits within one domain of LabelLevel, or may span more when it
	// does not fit (with an event saying so). Default: Required when a
	// level is given.
	LabelPolicy = "gpu.gpulink.dev/gang-policy"
	// LabelNameFrom is the key of another label of the pod whose value
	// names the gang, instead of LabelGang: for controllers that stamp
	// one pod template into many groups and label each group's pods
	// (leaderworkerset.sigs.k8s.io/group-key, batch.kubernetes.io/job-name).
	// A label key holds '/', so as a value it fits in an annotation only.
	LabelNameFrom = "gpu.gpulink.dev/gang-name-from"
)

// Policy says whether a gang's level is a requirement or a preference.
type Policy string

const (
	// Required: the gang waits until all of it fits within one domain
	// of its level.
	Required Policy = "Required"
	// Preferred: the gang stays within one domain of its level when it
	// can, and spans the fewest higher domains otherwise.
	Preferred Policy = "Preferred"
)

// Source says where a gang's identity comes from.
type Source string

const (
	SourcePodGroup Source = "PodGroup"
	SourceLabels   Source = "labels"
)

// Ref identifies a gang: a PodGroup, or a gang label value, in a namespace.
type Ref struct {
	Namespace string
	Name      string
	Source    Source
}

// Key is the gang's key for maps and indexes: "ns/PodGroup/name" or
// "ns/labels/name" (a PodGroup and a label gang of the same name are
// different gangs).
func (r Ref) Key() string { return r.Namespace + "/" + string(r.Source) + "/" + r.Name }

// String names the gang for events: "gang train-a" or "PodGroup train-a".
func (r Ref) String() string {
	if r.Source == SourcePodGroup {
		return "PodGroup " + r.Name
	}
	return "gang " + r.Name
}

// Spec is what a gang asks for.
type Spec struct {
	Ref
	// MinCount is how many of its pods are placed together.
	MinCount int
	// Level is the hierarchy level (name or node label key) the pods
	// must or should share; empty: none asked (the placement is still
	// link-minimal, as Preferred at the lowest level).
	Level  string
	Policy Policy
	// Why says where Level and Policy came from, for events.
	Why string
	// GroupClaims are the names of the PodGroup's own ResourceClaims
	// (spec.resourceClaims, KEP-5729), shared by all its pods.
	GroupClaims []string
	// AlignRails: the pods' NICs share rail indices across nodes
	// (LabelRails, rails.go).
	AlignRails bool
}

// RefOf returns the gang a pod names, if any: its PodGroup first, else
// its label gang (labelRef). podGroups tells whether the Workload API is
// served; without it a pod's schedulingGroup is ignored. Resolve refines
// this with the PodGroup's policy.
func RefOf(pod *corev1.Pod, podGroups bool) (Ref, bool) {
	if ref, ok := podGroupRef(pod, podGroups); ok {
		return ref, true
	}
	return labelRef(pod)
}

// PodGroupLookup returns the PodGroup of a namespace and name, if it
// exists (an informer's lister, or a list a CLI read).
type PodGroupLookup func(namespace, name string) (*schedulingv1beta1.PodGroup, bool)

// Resolve returns the pod's gang: its PodGroup, unless that PodGroup
// exists with the basic policy, which makes no gang: then the pod's gang
// labels, if any, and otherwise none (the pod is placed on its own, as a
// pod outside any PodGroup). A PodGroup that does not exist (yet) keeps
// the pod in it (its gang waits for it: the policy is not known); lookup
// nil: RefOf.
func Resolve(pod *corev1.Pod, podGroups bool, lookup PodGroupLookup) (Ref, bool) {
	ref, ok := podGroupRef(pod, podGroups)
	if !ok {
		return labelRef(pod)
	}
	if lookup == nil {
		return ref, true
	}
	if pg, found := lookup(ref.Namespace, ref.Name); found && pg.Spec.SchedulingPolicy.Gang == nil {
		return labelRef(pod)
	}
	return ref, true
}

// Candidates returns every gang the pod may be in, its PodGroup and its
// label gang, for indexes that must find the pod under either while the
// PodGroup's policy is not known.
func Candidates(pod *corev1.Pod, podGroups bool) []Ref {
	var out []Ref
	if ref, ok := podGroupRef(pod, podGroups); ok {
		out = append(out, ref)
	}
	if ref, ok := labelRef(pod); ok {
		out = append(out, ref)
	}
	return out
}

// podGroupRef is the PodGroup the pod's spec.schedulingGroup names.
func podGroupRef(pod *corev1.Pod, podGroups bool) (Ref, bool) {
	if !podGroups {
		return Ref{}, false
	}
	if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil && *g.PodGroupName != "" {
		return Ref{Namespace: pod.Namespace, Name: *g.PodGroupName, Source: SourcePodGroup}, true
	}
	return Ref{}, false
}

// labelRef is the gang of the pod's LabelGang, else the one named by the
// value of the label LabelNameFrom names. A pod whose LabelNameFrom label
// is missing is in a gang without a name, which FromLabels refuses: its
// pods wait with the reason rather than run one by one.
func labelRef(pod *corev1.Pod) (Ref, bool) {
	if name, ok := value(pod, LabelGang); ok && name != "" {
		return Ref{Namespace: pod.Namespace, Name: name, Source: SourceLabels}, true
	}
	if key, ok := value(pod, LabelNameFrom); ok && key != "" {
		return Ref{Namespace: pod.Namespace, Name: strings.TrimSpace(pod.Labels[key]), Source: SourceLabels}, true
	}
	return Ref{}, false
}

// value reads a key from the pod's labels, then its annotations.
func value(pod *corev1.Pod, key string) (string, bool) {
	if v, ok := pod.Labels[key]; ok {
		return strings.TrimSpace(v), true
	}
	v, ok := pod.Annotations[key]
	return strings.TrimSpace(v), ok
}

// FromLabels reads a label gang's spec from one of its pods.
func FromLabels(ref Ref, pod *corev1.Pod) (Spec, error) {
	s := Spec{Ref: ref}
	if ref.Name == "" {
		key, _ := value(pod, LabelNameFrom)
		return Spec{}, fmt.Errorf("pod %s/%s: %s=%s names the label that holds the gang's name, but the pod has no such label (or it is empty)",
			pod.Namespace, pod.Name, LabelNameFrom, key)
	}
	raw, ok := value(pod, LabelSize)
	if !ok {
		return Spec{}, fmt.Errorf("pod %s/%s: label %s=%s names a gang but %s is missing: set it to the number of pods to place together",
			pod.Namespace, pod.Name, LabelGang, ref.Name, LabelSize)
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 {
		return Spec{}, fmt.Errorf("pod %s/%s: %s=%q: want a positive integer", pod.Namespace, pod.Name, LabelSize, raw)
	}
	s.MinCount = n
	if err := s.levelFromPod(pod); err != nil {
		return Spec{}, err
	}
	if err := s.railsFrom(pod, nil); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// FromPodGroup reads a PodGroup's gang spec; ok is false when the PodGroup
// has the basic policy (its pods are no gang). pod, one of its pods, may
// override the level and policy with LabelLevel and LabelPolicy.
func FromPodGroup(ref Ref, pg *schedulingv1beta1.PodGroup, pod *corev1.Pod) (s Spec, ok bool, err error) {
	gang := pg.Spec.SchedulingPolicy.Gang
	if gang == nil {
		return Spec{}, false, nil
	}
	if gang.MinCount < 1 {
		return Spec{}, false, fmt.Errorf("PodGroup %s/%s: spec.schedulingPolicy.gang.minCount=%d: want at least 1", pg.Namespace, pg.Name, gang.MinCount)
	}
	s = Spec{Ref: ref, MinCount: int(gang.MinCount)}
	if c := pg.Spec.SchedulingConstraints; c != nil && len(c.Topology) > 0 && c.Topology[0].Key != "" {
		s.Level, s.Policy = c.Topology[0].Key, Required
		s.Why = "PodGroup schedulingConstraints.topology"
	}
	for _, rc := range pg.Spec.ResourceClaims {
		s.GroupClaims = append(s.GroupClaims, rc.Name)
	}
	if pod != nil {
		pgLevel := s.Level
		if err := s.levelFromPod(pod); err != nil {
			return Spec{}, false, err
		}
		if pgLevel != "" && s.Policy == Preferred {
			// kube-scheduler enforces the PodGroup's topology key too
			// (TopologyAwareWorkloadScheduling): a placement across its
			// domains would never be bound.
			return Spec{}, false, fmt.Errorf("pod %s/%s: %s=Preferred cannot relax PodGroup %s's schedulingConstraints.topology key %s, which kube-scheduler enforces; drop the PodGroup's topology constraint and set %s on the pods instead",
				pod.Namespace, pod.Name, LabelPolicy, pg.Name, pgLevel, LabelLevel)
		}
	}
	if err := s.railsFrom(pod, pg); err != nil {
		return Spec{}, false, err
	}
	return s, true, nil
}

// levelFromPod applies the pod's LabelLevel and LabelPolicy.
func (s *Spec) levelFromPod(pod *corev1.Pod) error {
	level, hasLevel := value(pod, LabelLevel)
	policy, hasPolicy := value(pod, LabelPolicy)
	if hasLevel && level != "" {
		s.Level, s.Policy, s.Why = level, Required, "pod label "+LabelLevel
	}
	if hasPolicy && policy != "" {
		switch strings.ToLower(policy) {
		case "required":
			s.Policy = Required
		case "preferred":
			s.Policy = Preferred
		default:
			return fmt.Errorf("pod %s/%s: %s=%q: want Required or Preferred", pod.Namespace, pod.Name, LabelPolicy, policy)
		}
		if s.Level == "" {
			return fmt.Errorf("pod %s/%s: %s=%s without a level: set %s (or a PodGroup topology key)", pod.Namespace, pod.Name, LabelPolicy, policy, LabelLevel)
		}
		s.Why += ", policy from pod label " + LabelPolicy
	}
	return nil
}
