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
//     level is given) or Preferred.
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
// its LabelGang label or annotation. podGroups tells whether the Workload
// API is served; without it a pod's schedulingGroup is ignored.
func RefOf(pod *corev1.Pod, podGroups bool) (Ref, bool) {
	if podGroups {
		if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil && *g.PodGroupName != "" {
			return Ref{Namespace: pod.Namespace, Name: *g.PodGroupName, Source: SourcePodGroup}, true
		}
	}
	if name, ok := value(pod, LabelGang); ok && name != "" {
		return Ref{Namespace: pod.Namespace, Name: name, Source: SourceLabels}, true
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
