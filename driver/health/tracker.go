package health

import (
	"maps"
	"slices"
	"time"
)

// Transition is how an event changed a GPU's health.
type Transition string

// Transitions returned by Tracker.Apply.
const (
	// Unchanged: same conditions as before.
	Unchanged Transition = "unchanged"
	// BecameUnhealthy: the GPU had no fatal condition and now has one.
	BecameUnhealthy Transition = "unhealthy"
	// StillUnhealthy: the set of fatal conditions changed, not empty
	// before or after.
	StillUnhealthy Transition = "still-unhealthy"
	// BecameHealthy: the last fatal condition was cleared.
	BecameHealthy Transition = "healthy"
)

// State is one GPU's health: the fatal conditions that are active and
// when each was first seen. No condition: healthy.
type State struct {
	Conditions map[string]time.Time
}

// Healthy reports whether no fatal condition is active.
func (s State) Healthy() bool { return len(s.Conditions) == 0 }

// Reason is the condition that names the GPU's state: the earliest one,
// ties broken by name; "" when healthy.
func (s State) Reason() (string, time.Time) {
	names := slices.Sorted(maps.Keys(s.Conditions))
	var best string
	var at time.Time
	for _, n := range names {
		if t := s.Conditions[n]; best == "" || t.Before(at) {
			best, at = n, t
		}
	}
	return best, at
}

// Tracker keeps the fatal conditions of every GPU. It is not safe for
// concurrent use; its owner serialises Apply.
type Tracker struct {
	policy  Policy
	devices map[string]map[string]time.Time
}

// NewTracker returns a tracker in which every GPU is healthy.
func NewTracker(p Policy) *Tracker {
	return &Tracker{policy: p, devices: map[string]map[string]time.Time{}}
}

// Policy returns the tracker's policy.
func (t *Tracker) Policy() Policy { return t.policy }

// Apply classifies e and updates e.Device's conditions: a fatal event adds
// its condition (a repeat keeps the first time), a recovery removes the
// condition it names or, naming none, all of them. Warnings and ignored
// events change nothing.
func (t *Tracker) Apply(e Event) (Verdict, Transition) {
	v := t.policy.Classify(e)
	conds := t.devices[e.Device]
	before := len(conds)
	switch v {
	case Fatal:
		c := e.FatalCondition()
		if _, ok := conds[c]; ok {
			return v, Unchanged
		}
		if conds == nil {
			conds = map[string]time.Time{}
			t.devices[e.Device] = conds
		}
		conds[c] = e.Time
	case Recovered:
		if before == 0 {
			return v, Unchanged
		}
		if e.Condition == "" {
			delete(t.devices, e.Device)
			return v, BecameHealthy
		}
		if _, ok := conds[e.Condition]; !ok {
			return v, Unchanged
		}
		delete(conds, e.Condition)
		if len(conds) == 0 {
			delete(t.devices, e.Device)
		}
	default:
		return v, Unchanged
	}
	after := len(t.devices[e.Device])
	switch {
	case before == 0 && after > 0:
		return v, BecameUnhealthy
	case before > 0 && after == 0:
		return v, BecameHealthy
	default:
		return v, StillUnhealthy
	}
}

// State returns a copy of device's state.
func (t *Tracker) State(device string) State {
	return State{Conditions: maps.Clone(t.devices[device])}
}

// Unhealthy returns a copy of the state of every GPU with a fatal
// condition, by device name.
func (t *Tracker) Unhealthy() map[string]State {
	out := make(map[string]State, len(t.devices))
	for d, c := range t.devices {
		out[d] = State{Conditions: maps.Clone(c)}
	}
	return out
}

// Restore sets the conditions of device (from persisted state); an empty
// map makes it healthy.
func (t *Tracker) Restore(device string, conds map[string]time.Time) {
	if len(conds) == 0 {
		delete(t.devices, device)
		return
	}
	t.devices[device] = maps.Clone(conds)
}
