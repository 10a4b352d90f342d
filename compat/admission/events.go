package admission

import (
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"github.com/gpulink/gpulink/compat"
)

// Event reasons.
const (
	ReasonTranslated = "GPUResourcesTranslated"
	actionTranslate  = "Translate"
)

// Announcer records a Normal event on every translated pod saying what
// its extended resources became. The webhook cannot: at admission a pod
// has no UID and, with generateName, no name. It runs in the leader only,
// so each pod gets one event (a new leader may repeat it once).
type Announcer struct {
	rec  events.EventRecorder
	mu   sync.Mutex
	seen map[types.UID]bool
}

// NewAnnouncer watches an informer of translated pods (label selector
// compat.LabelManaged=true).
func NewAnnouncer(informer cache.SharedIndexInformer, rec events.EventRecorder) (*Announcer, error) {
	a := &Announcer{rec: rec, seen: map[types.UID]bool{}}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    a.pod,
		UpdateFunc: func(_, o any) { a.pod(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				a.mu.Lock()
				delete(a.seen, p.UID)
				a.mu.Unlock()
			}
		},
	})
	return a, err
}

func (a *Announcer) pod(o any) {
	p, ok := o.(*corev1.Pod)
	if !ok || p.Labels[compat.LabelManaged] != "true" {
		return
	}
	summary := p.Annotations[compat.AnnotationTranslated]
	if summary == "" {
		return
	}
	a.mu.Lock()
	done := a.seen[p.UID]
	a.seen[p.UID] = true
	a.mu.Unlock()
	if done || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return
	}
	a.rec.Eventf(p, nil, corev1.EventTypeNormal, ReasonTranslated, actionTranslate, "%s", note(summary))
}

func note(summary string) string {
	// events/v1 notes are limited to 1 kB.
	const limit = 1000
	s := fmt.Sprintf("translated: %s", summary)
	if len(s) > limit {
		s = s[:limit-3] + "..."
	}
	return strings.TrimSpace(s)
}
