package controller

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
)

// Event actions (events/v1 action); the reasons are report.Reason*.
const (
	actionAllocate  = "Allocate"
	actionWait      = "Wait"
	actionRelease   = "Release"
	actionUngate    = "Ungate"
	actionInventory = "Inventory"
	actionHold      = "Hold"
)

// explainer records one event per decision on the pod (and the claim as
// related object). Repeated identical waiting messages for the same pod are
// recorded once, so a pod retried on every cluster change does not flood
// the event stream.
type explainer struct {
	rec events.EventRecorder

	mu   sync.Mutex
	last map[types.UID]string
}

func newExplainer(rec events.EventRecorder) *explainer {
	return &explainer{rec: rec, last: map[types.UID]string{}}
}

// event records an event unless it repeats the pod's previous one.
func (e *explainer) event(pod *corev1.Pod, related runtime.Object, eventType, reason, action, note string) {
	key := eventType + "/" + reason + "/" + note
	e.mu.Lock()
	if e.last[pod.UID] == key {
		e.mu.Unlock()
		return
	}
	e.last[pod.UID] = key
	e.mu.Unlock()
	e.rec.Eventf(pod, related, eventType, reason, action, "%s", note)
}

// forget drops the memory of a deleted pod.
func (e *explainer) forget(uid types.UID) {
	e.mu.Lock()
	delete(e.last, uid)
	e.mu.Unlock()
}
