package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/gang"
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
// the domain drains as the rest fills. Likewise a gang that fits
// elsewhere only across a wider domain than it spans on the reserved one
// is placed there (lowerPastSoftReservation). Once the holder has waited
// GangConfig.StrictReservationBound, the reservation turns strict and
// holds the domain against every pod: a stream of pods that fit nowhere
// else can then no longer keep the gang off it for ever.

// reservationSoft tells whether the reservation held since since (its
// holder's oldest pod's creation) is still soft. Called with r.mu held.
// A holder reserves only once it has waited past its starvation bound, so
// a strict bound not above that bound makes the reservation strict from
// the start, whichever bound the holder has.
func (c *Controller) reservationSoft(since time.Time) bool {
	return time.Since(since) < c.gangCfg.StrictReservationBound
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
	if r.gangKey == "" || r.gangKey == key || r.passing.Has(key) || !c.reservationSoft(r.since) {
		// passing already: a decision past the reservation asks again
		// within itself (lowerPastSoftReservation); the inner call must
		// not let the key's pass end under the outer one.
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

// gangRetry is a gang placement to try again past a soft reservation.
type gangRetry struct {
	ask gangAsk
	// level is the level the placement found without the reserved
	// domain spans.
	level int
	// place is placeGang's placement of the gang on its candidates, as
	// the node filter lets them through when called.
	place func() (*gang.Placement, []gang.Node, string, error)
}

// lowerPastSoftReservation places a gang that fitted elsewhere once more
// with a softly reserved domain in view, and assumes and returns that
// placement (ok) when it spans a lower level than try.level. A soft
// reservation keeps off the pods that fit elsewhere so that its domain
// drains, but a gang that fits elsewhere only across a wider domain (two
// leaves instead of one, two cliques instead of one) would pay for it in
// link class for as long as it runs; on the gang replay that cost up to
// 2.4 points of gangs on their minimal level against Kueue TAS, which
// never reserves, and letting such gangs in cost the starved gang no wait
// beyond noise (docs/performance/gangs.md). Called under the decision
// lock with the gang's first placement not assumed yet.
func (c *Controller) lowerPastSoftReservation(ctx context.Context, try gangRetry) (dec *gangDecision, nodes []gang.Node, rej string, ok bool) {
	a := try.ask
	c.pastSoftReservation(a.spec.Key(), func() {
		p, n, r, err := try.place()
		if err != nil || p.Level >= try.level {
			return
		}
		d, err := c.assumeGang(ctx, a.spec, a.ready, a.own, p)
		if err != nil {
			return
		}
		dec, nodes, rej, ok = d, n, r, true
		klog.FromContext(ctx).V(2).Info("Gang placed on a domain another gang reserves softly: it spans a lower level there", "level", p.LevelName, "elsewhere", c.hierarchy.Name(try.level))
	})
	return dec, nodes, rej, ok
}
