package gangs

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
)

// LabelRails, set to RailsAligned on a gang's pods (label or annotation)
// or as an annotation of its PodGroup, aligns the NIC rails of the gang's
// pods: every pod gets other drivers' devices (the NICs its claims ask
// for next to its GPUs) of the same rail indices on every node, so that
// rank i of one node talks to rank i of another over one rail of a
// rail-optimized network. RailsPerPod, the default, keeps each pod's own
// alignment of GPUs and NICs only.
const LabelRails = "gpu.gpulink.dev/gang-rails"

// Values of LabelRails.
const (
	RailsAligned = "aligned"
	RailsPerPod  = "per-pod"
)

// railsFrom reads LabelRails from the pod, then (when the pod does not
// set it) from the PodGroup's annotations.
func (s *Spec) railsFrom(pod *corev1.Pod, pg *schedulingv1beta1.PodGroup) error {
	v, ok, where := "", false, ""
	if pod != nil {
		v, ok = value(pod, LabelRails)
		where = fmt.Sprintf("pod %s/%s", pod.Namespace, pod.Name)
	}
	if !ok && pg != nil {
		v, ok = pg.Annotations[LabelRails]
		v = strings.TrimSpace(v)
		where = fmt.Sprintf("PodGroup %s/%s", pg.Namespace, pg.Name)
	}
	if !ok || v == "" {
		return nil
	}
	switch strings.ToLower(v) {
	case RailsAligned:
		s.AlignRails = true
	case RailsPerPod:
		s.AlignRails = false
	default:
		return fmt.Errorf("%s: %s=%q: want %s or %s", where, LabelRails, v, RailsAligned, RailsPerPod)
	}
	return nil
}
