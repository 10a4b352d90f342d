package controller

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Soft reservations.
//
// A strict reservation leaves its domain partly idle while it drains: the
// domain's GPUs that free up wait for the gang, and the pods turned away
// wait too when nothing else has room. On the gang replay that cost up to
// 1.2 points of GPU utilisation and several minutes of mean wait against
// Kueue TAS, which never reserves (docs/performance/gangs.md). So a
// reservation starts soft: it holds its domain only against the pods that
// fit somewhere else. A pod (or gang) that fits nowhere but there is still
// placed there, since holding it off would only add idle GPUs to the
// domain, and the rest of the cluster's churn keeps going elsewhere, so
// the domain drains as the rest fills. Once the holder has waited
// GangConfig.StrictReservationBound, the reservation turns strict and
// holds the domain against every pod: a stream of pods that fit nowhere
// else can then no longer keep the gang off it for ever.

// reservationSoft tells whether the reservation held since since (its
// holder's oldest pod's creation) is still soft. Called with r.mu held.
func (c *Controller) reservationSoft(since time.Time) bool {
	strict := c.gangCfg.StrictReservationBound
	return strict > c.gangCfg.StarvationBound && time.Since(since) < strict
}

// passKey is the key under which a pod's decision passes a soft
// reservation: its gang's key, or its UID for a pod outside any gang.
func (c *Controller) passKey(pod *corev1.Pod) string {
	if ref, ok := c.gangOf(pod); ok {
		return ref.Key()
	}
	return "pod/" + string(pod.UID)
}

// pastSoftReservation runs decide with the pods under key let onto the
// reserved domain, when another gang holds a reservation that is still
// soft; it tells whether it ran decide. Callers run it after a decision
// that found no room, so only pods that fit nowhere else get there.
func (c *Controller) pastSoftReservation(key string, decide func()) bool {
	r := &c.reserve
	r.mu.Lock()
	if r.gangKey == "" || r.gangKey == key || !c.reservationSoft(r.since) {
		r.mu.Unlock()
		return false
	}
	if r.passing == nil {
		r.passing = sets.New[string]()
	}
	r.passing.Insert(key)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.passing.Delete(key)
		r.mu.Unlock()
	}()
	decide()
	return true
}
