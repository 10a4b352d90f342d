package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/driver"
)

// otherGate returns the first scheduling gate of the pod that is not
// gpulink's, "" when there is none.
//
// Another gate means another controller holds the pod back: Kueue's
// kueue.x-k8s.io/admission on a plain pod it has not admitted (its quota
// may never allow it), a gang scheduler's own gate, a user's. kube-scheduler
// does not schedule the pod before every gate is gone, so devices allocated
// now would sit idle for as long as the other gate stays, possibly for
// ever, while other pods could use them. The controller therefore chooses
// a pod's devices only once its own gate is the last one; the gate
// removal is a pod update, which brings the pod back.
func otherGate(pod *corev1.Pod) string {
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name != driver.SchedulingGate {
			return g.Name
		}
	}
	return ""
}

// heldByOtherGate is podClaims.notReady for a gated pod whose devices are
// still to be chosen while another gate holds it.
func heldByOtherGate(pod *corev1.Pod, pc podClaims) string {
	if gateIndex(pod) < 0 {
		return ""
	}
	gate := otherGate(pod)
	if gate == "" {
		return ""
	}
	for _, ic := range pc.ours {
		if ic.Claim.Status.Allocation == nil {
			return fmt.Sprintf("the pod is also held by scheduling gate %s: its GPUs are chosen once that gate is removed", gate)
		}
	}
	return ""
}
