package controller

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// Starvation policy between singletons and gangs.
//
// A gang holds nothing while it waits, so it never blocks a singleton or
// another gang. The other way round, a stream of singletons could keep a
// gang from ever fitting. So: a gang that has waited longer than its
// starvation bound (from its oldest pod's creation;
// GangConfig.StarvationBound, or PreferredStarvationBound when its level
// is not Required; starvationBound) reserves the domain it is closest to
// fitting in (at its Required level, else at the
// lowest level with enough GPUs for it when idle: the domain with the most
// slots for it now, then the most free GPUs, then the name). While the
// reservation lasts, no other pod, singleton or gang, is placed on the
// domain's nodes, except, while it is soft (the first
// GangConfig.StrictReservationBound of the gang's wait;
// gang_reserve_soft.go), those that fit nowhere else; what runs there is
// never touched, so the domain drains as its pods end and the gang then
// fits. One gang reserves at a time, so
// singletons are only held off one domain, and only while that gang
// waits. The reservation ends when the gang is placed or none of its pods
// waits any more. It lives in the leader's memory: a new leader rebuilds
// it the first time the gang is evaluated.
//
// When several gangs this leader has seen are past the bound, the one
// whose reserved domain would be of the highest level reserves first, the
// oldest among equals (outranks). The oldest first served mostly gangs
// that fit on their own soon after: on the gang replay's busiest cell
// (docs/performance/gangs.md) the oldest past the bound was a leaf-sized
// gang in 90 of 101 reservations, while the spine-sized gangs, which need
// a whole spine's nodes free at once and which the churn of smaller jobs
// never leaves, mostly never started (7 of 39 per seed without
// reservations). A lower gang reserves once no higher one waits past the
// bound; meanwhile it is placed whenever it fits, like any gang.

// reservations holds the current reservation, if any.
type reservations struct {
	mu      sync.Mutex
	gangKey string // "" when none
	gang    string // for messages
	domain  string
	nodes   sets.Set[string]
	// since is the holder's oldest pod's creation, from which the
	// reservation's softness is counted (reservationSoft).
	since time.Time
	// bound is the holder's starvation bound, for messages.
	bound time.Duration
	// passing are the keys (passKey) of the decisions let past a soft
	// reservation right now (pastSoftReservation).
	passing sets.Set[string]
	// held is the reserved nodes as the holder saw them: what the other
	// gangs' node filter hides from them, added back to rank them
	// (withHeld).
	held []gang.Node
	// starved is every gang seen waiting past the bound that an idle
	// domain could hold, by gang key, until it is placed or found no
	// longer waiting: the gangs a free reservation goes to, by outranks.
	starved map[string]starvedGang
}

// starvedGang is a gang waiting past the bound, as outranks ranks it.
type starvedGang struct {
	name  string // for messages
	level int    // the level of the domain it would reserve
	since time.Time
}

// outranks tells whether a reserves before b: the higher level first (a
// larger domain, which the churn of smaller jobs never drains on its
// own), then the longer wait, then the key (ak is a's key, bk b's).
func (a starvedGang) outranks(b starvedGang, ak, bk string) bool {
	if a.level != b.level {
		return a.level > b.level
	}
	if !a.since.Equal(b.since) {
		return a.since.Before(b.since)
	}
	return ak < bk
}

// reservedFor returns the gang holding node against the decision of key
// (passKey: a gang's key, or a singleton's), or "" when the node is free
// to it, and the holder's starvation bound.
func (c *Controller) reservedFor(node, key string) (string, time.Duration) {
	r := &c.reserve
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gangKey == "" || r.gangKey == key || !r.nodes.Has(node) || r.passing.Has(key) {
		return "", 0
	}
	return r.gang, r.bound
}

// reservedAgainst is the node filter's hook (planner.NodeFilter.Reserved).
func (c *Controller) reservedAgainst(pod *corev1.Pod, node string) string {
	holder, bound := c.reservedFor(node, c.passKey(pod))
	if holder == "" {
		return ""
	}
	return fmt.Sprintf("reserved for %s, which waited longer than the starvation bound (%s)", holder, bound)
}

// starvationBound is how long a gang of this request waits before it may
// reserve; 0: never. A gang whose level is not Required waits the longer
// PreferredStarvationBound when one is set: it starts as soon as the
// whole cluster has room for it, so a reservation is rarely what places
// it, and on the gang replay the domains reserved early for such gangs
// cost the gangs that came after them their minimal level and their wait
// against Kueue TAS, which never reserves, while a third of the holders
// then started elsewhere (docs/performance/gangs.md). Its worst case is
// unchanged: the strict bound (reservationSoft) counts from its wait too.
func (c *Controller) starvationBound(req gang.Request) time.Duration {
	bound := c.gangCfg.StarvationBound
	if bound > 0 && req.Constraint != gang.Required && c.gangCfg.PreferredStarvationBound > 0 {
		return c.gangCfg.PreferredStarvationBound
	}
	return bound
}

// releaseReservation ends the gang's reservation, if it holds one.
func (c *Controller) releaseReservation(gangKey string) {
	r := &c.reserve
	r.mu.Lock()
	delete(r.starved, gangKey)
	released := r.gangKey == gangKey && gangKey != ""
	if released {
		r.gangKey, r.gang, r.domain, r.nodes, r.held, r.since, r.bound = "", "", "", nil, nil, time.Time{}, 0
		c.metrics.GangReservedNodes.Set(0)
	}
	r.mu.Unlock()
	if released {
		// Pods held off the domain may fit now.
		c.enqueueWaiting()
	}
}

// checkReservation ends a reservation whose gang no longer waits (its pods
// are gone, placed by someone else or finished).
func (c *Controller) checkReservation() {
	r := &c.reserve
	r.mu.Lock()
	key := r.gangKey
	r.mu.Unlock()
	if key == "" || c.gangWaits(key) {
		return
	}
	c.releaseReservation(key)
}

// gangWaits tells whether a pod of the gang still waits for gpulink: not
// deleted, not done, not handed over to kube-scheduler.
func (c *Controller) gangWaits(key string) bool {
	for _, pod := range c.gangPods(key) {
		if podLive(pod) && !c.handedOver(pod) {
			return true
		}
	}
	return false
}

// outrankedBy returns the name of a gang past the bound that reserves
// before g (key), "" when none does. The other gangs recorded as starved
// that no longer wait are forgotten.
func (c *Controller) outrankedBy(key string, g starvedGang) string {
	r := &c.reserve
	r.mu.Lock()
	others := make(map[string]starvedGang, len(r.starved))
	for k, o := range r.starved {
		if k != key {
			others[k] = o
		}
	}
	r.mu.Unlock()
	// Checked outside the lock: gangWaits reads the pod lister.
	var gone []string
	rival := ""
	for _, k := range slices.Sorted(maps.Keys(others)) {
		if !c.gangWaits(k) {
			gone = append(gone, k)
		} else if o := others[k]; rival == "" && o.outranks(g, k, key) {
			rival = o.name
		}
	}
	if len(gone) > 0 {
		r.mu.Lock()
		for _, k := range gone {
			delete(r.starved, k)
		}
		r.mu.Unlock()
	}
	return rival
}

// considerReserving reserves a domain for a waiting gang that has waited
// longer than the bound, when no other gang holds a reservation.
func (c *Controller) considerReserving(ctx context.Context, spec gangs.Spec, members []*gangMember, req gang.Request, nodes []gang.Node) {
	bound := c.starvationBound(req)
	if bound <= 0 || len(nodes) == 0 {
		return
	}
	since := oldestCreation(members)
	waited := time.Since(since)
	if waited <= bound {
		return
	}
	c.checkReservation()
	r := &c.reserve
	r.mu.Lock()
	holds, held := r.gangKey == spec.Key(), r.held
	r.mu.Unlock()
	if holds {
		return
	}
	level, domain, chosen, ok := closestDomain(c.hierarchy, req, withHeld(nodes, held))
	me := starvedGang{name: spec.String(), level: level, since: since}
	r.mu.Lock()
	if ok {
		// Recorded while another gang holds the reservation too, so that
		// when it ends the gang that outranks the rest takes it.
		if r.starved == nil {
			r.starved = map[string]starvedGang{}
		}
		r.starved[spec.Key()] = me
	} else {
		// It could never use a reservation: it must not keep one from
		// the gangs it would outrank.
		delete(r.starved, spec.Key())
	}
	busy := r.gangKey != "" || len(held) > 0
	r.mu.Unlock()
	if busy {
		// Another gang holds the reservation (or did when the domain was
		// chosen): its release evaluates the waiting gangs again.
		return
	}
	if ok {
		if rival := c.outrankedBy(spec.Key(), me); rival != "" {
			klog.FromContext(ctx).V(2).Info("Gang past the starvation bound leaves the reservation to a gang that outranks it", "outrankedBy", rival, "level", c.hierarchy.Name(level))
			return
		}
	}
	r.mu.Lock()
	if r.gangKey != "" {
		r.mu.Unlock()
		return
	}
	if !ok {
		r.mu.Unlock()
		// Holding a domain would never let this gang run and would only
		// keep every other pod off it: a gang any namespace can create
		// (labels) must not be able to do that.
		msg := fmt.Sprintf("%s waited %s, longer than the starvation bound %s, but reserves nothing: no %s could hold its %d pods × %d GPUs even idle",
			spec.Ref, waited.Round(time.Second), bound, c.hierarchy.Name(level), req.Pods, req.GPUsPerPod)
		klog.FromContext(ctx).V(2).Info("Gang cannot fit even idle, no reservation", "level", c.hierarchy.Name(level), "pods", req.Pods, "gpusPerPod", req.GPUsPerPod)
		c.gangEvent(members, corev1.EventTypeWarning, report.ReasonGangReserved, actionWait, msg)
		return
	}
	r.gangKey, r.gang, r.domain, r.nodes, r.since, r.bound = spec.Key(), spec.String(), domain, chosen, since, bound
	soft := c.reservationSoft(since)
	r.held = nil // a new slice: readers keep the old one
	for _, n := range nodes {
		if chosen.Has(n.Name) {
			r.held = append(r.held, n)
		}
	}
	c.metrics.GangReservations.Inc()
	c.metrics.GangReservedNodes.Set(float64(len(chosen)))
	r.mu.Unlock()
	names := sets.List(chosen)
	if len(names) > 4 {
		names = append(names[:4], fmt.Sprintf("and %d more", len(chosen)-4))
	}
	where := c.hierarchy.Name(level)
	if domain != "" {
		where += " " + domain
	}
	keptOff := "no other pod is placed there until the gang is placed"
	if soft {
		keptOff = fmt.Sprintf("until it has waited %s only pods that fit nowhere else, or gangs that would span a wider domain elsewhere, are placed there, then none until the gang is placed", c.gangCfg.StrictReservationBound)
	}
	msg := fmt.Sprintf("%s waited %s, longer than the starvation bound %s: reserving %s (nodes %s); %s",
		spec.Ref, waited.Round(time.Second), bound, where, strings.Join(names, ", "), keptOff)
	klog.FromContext(ctx).Info("Gang reserves a domain", "level", where, "nodes", len(chosen), "waited", waited)
	c.gangEvent(members, corev1.EventTypeNormal, report.ReasonGangReserved, actionWait, msg)
}

// withHeld is nodes with the reserved nodes (held) that the node filter
// left out of them added back, without room: where the gang would
// reserve is decided as if no gang held a reservation (closestDomain
// looks at what the domains hold idle), and a node it could use must not
// be taken for free.
func withHeld(nodes, held []gang.Node) []gang.Node {
	if len(held) == 0 {
		return nodes
	}
	seen := make(sets.Set[string], len(nodes))
	for _, n := range nodes {
		seen.Insert(n.Name)
	}
	out := slices.Clone(nodes)
	for _, n := range held {
		if !seen.Has(n.Name) {
			n.Slots, n.FreeGPUs, n.AlignedSlots = 0, 0, nil
			out = append(out, n)
		}
	}
	return out
}

// oldestCreation is the creation time of the gang's oldest pod, from
// which its wait is counted (the starvation bound, gang_wait_seconds).
func oldestCreation(members []*gangMember) time.Time {
	oldest := time.Time{}
	for _, m := range members {
		if t := m.pod.CreationTimestamp.Time; oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return oldest
}

// closestDomain picks the domain a waiting gang is closest to fitting in:
// at its Required level, else the lowest level where a domain has enough
// GPUs for the gang when idle; there, the domain with the most slots now,
// then the most free GPUs, then the lowest name. ok is false when no
// domain could hold the gang even idle (level is then the last one
// tried): reserving would hold other pods off for nothing.
func closestDomain(h *gang.Hierarchy, req gang.Request, nodes []gang.Node) (level int, domain string, chosen sets.Set[string], ok bool) {
	need := req.MinCount
	if need <= 0 {
		need = req.Pods
	}
	perPod := max(req.GPUsPerPod, 1)
	type dom struct {
		name              string
		nodes             []string
		slots, free, idle int
	}
	domainsAt := func(l int) []*dom {
		by := map[string]*dom{}
		for _, n := range nodes {
			name := ""
			switch {
			case l == 0:
				name = n.Name
			case l < h.Cluster():
				if l-1 < len(n.Domains) {
					name = n.Domains[l-1]
				}
				if name == "" {
					continue
				}
			}
			d := by[name]
			if d == nil {
				d = &dom{name: name}
				by[name] = d
			}
			d.nodes = append(d.nodes, n.Name)
			d.slots += n.Slots
			d.free += n.FreeGPUs
			d.idle += n.TotalGPUs / perPod
		}
		out := make([]*dom, 0, len(by))
		for _, d := range by {
			out = append(out, d)
		}
		return out
	}
	pick := func(ds []*dom) *dom {
		slices.SortFunc(ds, func(a, b *dom) int {
			return cmp.Or(cmp.Compare(b.slots, a.slots), cmp.Compare(b.free, a.free), cmp.Compare(a.name, b.name))
		})
		return ds[0]
	}
	levels := []int{}
	if req.Constraint == gang.Required {
		levels = append(levels, req.Level)
	} else {
		for l := req.Level; l <= h.Cluster(); l++ {
			levels = append(levels, l)
		}
	}
	for _, l := range levels {
		var fits []*dom
		for _, d := range domainsAt(l) {
			if d.idle >= need {
				fits = append(fits, d)
			}
		}
		if len(fits) > 0 {
			d := pick(fits)
			return l, d.name, sets.New(d.nodes...), true
		}
	}
	return levels[len(levels)-1], "", nil, false
}
