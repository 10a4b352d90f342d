package controller

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
)

// gangRuns serializes the work on each gang: one worker evaluates and
// writes a gang at a time; others that get one of its pods meanwhile mark
// it dirty, and the running one queues the pod again when it is done.
//
// It also spares a waiting gang the same evaluation once per pod: every
// change that may help waiting pods (enqueueWaiting) queues all of a
// gang's pods, and each would evaluate the whole gang again. A gang that
// waited after an evaluation is not evaluated again until its pods or
// their claims change (their resourceVersions) or enqueueWaiting runs
// again (changes).
type gangRuns struct {
	mu   sync.Mutex
	busy map[string][]string // gang key -> pod keys to queue again
	// waited is the fingerprint of each gang's last evaluation that
	// ended waiting.
	waited  map[string]uint64
	changes atomic.Uint64
	// evaluations counts evaluateGang calls (tests).
	evaluations atomic.Int64
	// decisions and placements count, per gang key, the decisions that
	// reached a placement and the placements (placeGang) they made, while
	// counting is on (tests: the maps are never pruned).
	counting              atomic.Bool
	decisions, placements sync.Map
}

// count adds one to m's counter for key, while counting is on.
func (r *gangRuns) count(m *sync.Map, key string) {
	if !r.counting.Load() {
		return
	}
	v, _ := m.LoadOrStore(key, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// counted reads m's counter for key.
func counted(m *sync.Map, key string) int64 {
	if v, ok := m.Load(key); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// fingerprint identifies what a gang's evaluation read: its pods and
// claims as the informers show them, and the count of changes.
func (r *gangRuns) fingerprint(members []*gangMember) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d;", r.changes.Load())
	for _, m := range members {
		fmt.Fprintf(h, "%s/%s/%d;", m.pod.Name, m.pod.ResourceVersion, len(m.pc.all))
		for _, cl := range m.pc.all {
			fmt.Fprintf(h, "%s/%s;", cl.Name, cl.ResourceVersion)
		}
	}
	return h.Sum64()
}

// unchanged tells whether the gang waited after an evaluation of the
// same fingerprint.
func (r *gangRuns) unchanged(gangKey string, fp uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.waited[gangKey]
	return ok && last == fp
}

// waitedAt records (or, with ok false, forgets) the gang's waiting
// evaluation.
func (r *gangRuns) waitedAt(gangKey string, fp uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waited == nil {
		r.waited = map[string]uint64{}
	}
	if ok {
		r.waited[gangKey] = fp
	} else {
		delete(r.waited, gangKey)
	}
}

func (r *gangRuns) start(gangKey, podKey string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if again, ok := r.busy[gangKey]; ok {
		if !slices.Contains(again, podKey) {
			r.busy[gangKey] = append(again, podKey)
		}
		return false
	}
	r.busy[gangKey] = nil
	return true
}

func (r *gangRuns) done(gangKey string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	again := r.busy[gangKey]
	delete(r.busy, gangKey)
	return again
}

// inGangRun runs work as the one worker on the pod's gang, with the gang
// in its logger; a pod whose gang is already being worked on is queued
// again when that run ends (gangRuns.start/done).
func (c *Controller) inGangRun(ctx context.Context, key string, ref gangs.Ref, work func(context.Context) error) error {
	if !c.gangRuns.start(ref.Key(), key) {
		return nil
	}
	defer func() {
		for _, k := range c.gangRuns.done(ref.Key()) {
			c.podQueue.Add(k)
		}
	}()
	return work(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("gang", ref.Key())))
}
