package gangbench

import (
	"math/rand/v2"
	"slices"
)

// DefaultStarvationBound is the controller's default
// --gang-starvation-bound (controller.gangs.starvationBound), in seconds.
const DefaultStarvationBound = 900

// DefaultPreferredStarvationBound is the controller's default
// --gang-preferred-starvation-bound
// (controller.gangs.preferredStarvationBound), in seconds.
const DefaultPreferredStarvationBound = 4 * 3600

// DefaultStrictReservationBound is the controller's default
// --gang-strict-reservation-bound (controller.gangs.strictReservationBound),
// in seconds.
const DefaultStrictReservationBound = 8 * 3600

// The gpulink:starvationBound row replays the controller's starvation
// policy (controller/gang_reserve.go, docs/gangs.md "Singletons and
// gangs") on top of the backfill queue every row shares: a gang that has
// waited longer than its bound (Options.StarvationBound under Required,
// else Options.PreferredStarvationBound; starvationBound) reserves the
// domain it is closest to fitting in, and no other job is placed on that domain's
// nodes until the gang is placed; one gang reserves at a time, the one
// of the highest minimal level among those past the bound (nextHolder).
// Until the holder has waited Options.StrictReservationBound the
// reservation is soft (controller/gang_reserve_soft.go): a job that fits
// nowhere else is still placed on the domain.
// The holder is tried first in each pass, with every node in view, as the
// controller lets it use any node. The other rows keep the plain queue,
// so that they compare placements, not queues.

// reservation is the domain held for one waiting gang.
type reservation struct {
	holder int   // index into the replay's jobs, -1 when none
	nodes  []int // the reserved nodes
}

// passArgs are what a pass needs besides the pending jobs.
type passArgs struct {
	place placer
	opt   Options
	r     *rand.Rand
	start func(int)
	t     float64
}

// passReserving is passWhole with the starvation reservation rv: the
// holder first, then the other pending jobs with the reserved nodes out of
// view, then, when no gang holds a reservation, the pending gang past the
// bound that nextHolder ranks first reserves one.
func passReserving(s *state, js []jobState, pending []int, a passArgs, rv *reservation) []int {
	if rv.holder >= 0 && len(passWhole(s, js, []int{rv.holder}, a.place, a.opt.Required, a.r, a.start)) == 0 {
		rv.holder, rv.nodes = -1, nil
	}
	others := slices.DeleteFunc(slices.Clone(pending), func(y int) bool {
		return y == rv.holder || js[y].start >= 0
	})
	var keep []int
	if rv.holder >= 0 && a.t-js[rv.holder].job.Submit < a.opt.StrictReservationBound {
		keep = passWhole(s, js, others, rv.softly(a.place), a.opt.Required, a.r, a.start)
	} else {
		restore := rv.hide(s)
		keep = passWhole(s, js, others, a.place, a.opt.Required, a.r, a.start)
		restore()
	}
	if rv.holder >= 0 {
		keep = append(keep, rv.holder)
		slices.Sort(keep) // arrival order, as passWhole expects
		return keep
	}
	if x, nodes := nextHolder(s, js, keep, a); nodes != nil {
		rv.holder, rv.nodes = x, nodes
	}
	return keep
}

// hide takes the reserved nodes out of view (no room left) and returns
// what puts them back.
func (rv *reservation) hide(s *state) func() {
	free := make([]int, len(rv.nodes))
	for k, i := range rv.nodes {
		free[k] = s.free[i]
		s.move(i, 0)
	}
	return func() {
		for k, i := range rv.nodes {
			s.move(i, free[k])
		}
	}
}

// softly is place under a soft reservation: a job is placed with the
// reserved nodes out of view, and only when it fits nowhere else, or is a
// gang that spans a lower level with them, with them in view, as the
// controller decides a pod again past a soft reservation after it found
// no room or a gang placed above its minimal level.
func (rv *reservation) softly(place placer) placer {
	return func(s *state, j *Job, maxLevel int, r *rand.Rand) []int {
		restore := rv.hide(s)
		nodes := place(s, j, maxLevel, r)
		restore()
		if nodes == nil {
			nodes = place(s, j, maxLevel, r)
		} else if j.Pods > 1 {
			// A gang that fits elsewhere only across a wider domain than
			// it would span with the reserved nodes goes there
			// (controller/gang_reserve_soft.go, lowerPastSoftReservation).
			if lv := s.c.Span(nodes); lv > s.c.MinLevel(j.Pods, j.GPUsPerPod) {
				if in := place(s, j, maxLevel, r); in != nil && s.c.Span(in) < lv {
					nodes = in
				}
			}
		}
		return nodes
	}
}

// nextHolder is the controller's choice of the gang that reserves
// (controller/gang_reserve.go, outranks): among the pending gangs past
// the bound that some domain could hold idle, the one whose minimal level
// is the highest, the oldest among equals (keep is in arrival order). It
// returns -1 and nil when none qualifies.
func nextHolder(s *state, js []jobState, keep []int, a passArgs) (int, []int) {
	holder, level := -1, -1
	var held []int
	for _, x := range keep {
		j := js[x].job
		if j.Pods < 2 || a.t-j.Submit <= a.opt.starvationBound() {
			continue
		}
		lv := s.c.MinLevel(j.Pods, j.GPUsPerPod)
		if lv <= level {
			continue
		}
		if nodes := closestDomain(s, j); nodes != nil {
			holder, level, held = x, lv, nodes
		}
	}
	return holder, held
}

// starvationBound is how long a gang waits before it may reserve: the
// controller's bound for a gang under Required, its longer one for a gang
// whose level is only preferred (controller/gang_reserve.go,
// starvationBound).
func (o *Options) starvationBound() float64 {
	if o.Required {
		return o.StarvationBound
	}
	return o.PreferredStarvationBound
}

// requiredLevel is the level a job must fit within: its minimal level
// under Required (gangs only), else anywhere.
func requiredLevel(c *Cluster, j *Job, required bool) int {
	if required && j.Pods > 1 {
		return c.MinLevel(j.Pods, j.GPUsPerPod)
	}
	return c.H.Cluster()
}

// closestDomain is the controller's choice of the domain to reserve
// (controller.closestDomain): at the lowest level with a domain that
// holds the gang when idle (its Required level in this replay, which
// requires the minimal one), the domain with the most slots for its pods
// now, then the most free GPUs, then the first by name (the nodes are in
// name order). nil when no domain could hold it even idle: reserving
// would only keep the other jobs off.
func closestDomain(s *state, j *Job) []int {
	level := s.c.MinLevel(j.Pods, j.GPUsPerPod)
	per := GPUsPerNode / j.GPUsPerPod
	all := s.allNodes()
	if level >= s.c.H.Cluster() {
		if len(all)*per < j.Pods {
			return nil
		}
		return all
	}
	var best *tdomain
	domains := s.domainsAt(all, level, j.GPUsPerPod)
	for k := range domains {
		d := &domains[k]
		if len(d.nodes)*per < j.Pods {
			continue
		}
		if best == nil || d.count > best.count || d.count == best.count && d.free > best.free {
			best = d
		}
	}
	if best == nil {
		return nil
	}
	return best.nodes
}
