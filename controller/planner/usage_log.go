package planner

// usageLog records, in order, the pools whose usage generation moved, so
// that a decision can rescore only the nodes that changed since its
// request shape's last decision (rankIndex) instead of reading every
// node's generation. It keeps the last usageLogSize changes: a shape
// that was not decided for longer reads every node's generation again.
type usageLog struct {
	// seq counts the changes ever recorded; change s (0-based) is in
	// pools[s%usageLogSize] while seq-s <= usageLogSize.
	seq   uint64
	pools []string
}

// usageLogSize bounds the changes kept. A claim moves its pool's
// generation a few times (assumed, written, seen by the informer, its
// pod's CPU and memory counted, released): a request shape decided once
// in every few hundred claims still finds its changes there.
const usageLogSize = 16384

// add records that pool's generation moved.
func (l *usageLog) add(pool string) {
	if l.pools == nil {
		l.pools = make([]string, usageLogSize)
	}
	l.pools[l.seq%usageLogSize] = pool
	l.seq++
}

// since appends to out the pools whose generation moved after the first
// from changes, and returns the count of changes now; ok is false when
// some of them are no longer kept (out is then unchanged).
func (l *usageLog) since(from uint64, out []string) (_ []string, now uint64, ok bool) {
	if from > l.seq || l.seq-from > usageLogSize {
		return out, l.seq, false
	}
	for s := from; s < l.seq; s++ {
		out = append(out, l.pools[s%usageLogSize])
	}
	return out, l.seq, true
}
