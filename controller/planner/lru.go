package planner

import "container/list"

// memoEntriesPerNode bounds each per-node memo (selector results, share
// consumption). Gated pods may carry any number of distinct selectors and
// share sizes; the memos only have to hold those of the pods being
// decided now, so the least recently used entries are dropped beyond it.
const memoEntriesPerNode = 256

// lru is a least-recently-used map with a fixed capacity. It does no
// locking; nodeInventory.memoMu guards its memos.
type lru[V any] struct {
	max   int
	order *list.List // front = most recent; values are *lruEntry[V]
	items map[string]*list.Element
}

type lruEntry[V any] struct {
	key string
	val V
}

func newLRU[V any](capacity int) *lru[V] {
	return &lru[V]{max: capacity, order: list.New(), items: map[string]*list.Element{}}
}

func (l *lru[V]) get(key string) (V, bool) {
	if e, ok := l.items[key]; ok {
		l.order.MoveToFront(e)
		return e.Value.(*lruEntry[V]).val, true
	}
	var zero V
	return zero, false
}

func (l *lru[V]) put(key string, val V) {
	if e, ok := l.items[key]; ok {
		e.Value.(*lruEntry[V]).val = val
		l.order.MoveToFront(e)
		return
	}
	l.items[key] = l.order.PushFront(&lruEntry[V]{key: key, val: val})
	for l.order.Len() > l.max {
		oldest := l.order.Back()
		l.order.Remove(oldest)
		delete(l.items, oldest.Value.(*lruEntry[V]).key)
	}
}

func (l *lru[V]) len() int { return l.order.Len() }
