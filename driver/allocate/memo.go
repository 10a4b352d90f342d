package allocate

import (
	"sync"

	"github.com/gpulink/gpulink/driver/topology"
)

// memoMinFree is the fewest free GPUs whose exact searches are memoized:
// below it a search takes a few microseconds, less than it is worth
// keeping. At 16 free GPUs (an idle 16-GPU node) it takes 0.15-0.5 ms.
const memoMinFree = 12

// memoMaxEntries bounds the memo (each entry about 350 bytes); when full
// it is emptied and refilled by the searches that follow.
const memoMaxEntries = 4096

// memoKey is everything an exact search's answer depends on: the links
// among the free GPUs in local numbering, the candidates, the size, the
// required link and the mix. Nodes of one kind in one state (idle nodes
// above all) share an entry whatever their names and GPU positions, as
// the answer is in local numbering.
type memoKey struct {
	links    [exactMaxFree * exactMaxFree]uint8
	f, k     uint8
	required uint8
	cand     uint32
	mix      [exactMaxFree + 1]uint32
}

// memoVal is an exact search's answer in local numbering.
type memoVal struct {
	set     uint32
	key     key
	bestAny key
	found   bool
}

// searchMemo keeps answers of exact searches on many free GPUs. The
// search is a pure function of memoKey, so a hit returns exactly what the
// search would; the memo changes only how long a decision takes.
type searchMemo struct {
	mu      sync.Mutex
	entries map[memoKey]memoVal
	off     bool // for benchmarks of the search itself
}

var memo = &searchMemo{entries: map[memoKey]memoVal{}}

func makeMemoKey(l *local, lcand uint32, k int, required topology.Link, mix *SizeMix) memoKey {
	mk := memoKey{f: uint8(l.f), k: uint8(k), required: uint8(required), cand: lcand, mix: mix.orDefault().w}
	for i := range l.f {
		copy(mk.links[i*exactMaxFree:i*exactMaxFree+l.f], l.link[i<<4:i<<4+l.f])
	}
	return mk
}

func (m *searchMemo) get(k *memoKey) (memoVal, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return memoVal{}, false
	}
	v, ok := m.entries[*k]
	return v, ok
}

func (m *searchMemo) put(k *memoKey, v memoVal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.off {
		return
	}
	if len(m.entries) >= memoMaxEntries {
		clear(m.entries)
	}
	m.entries[*k] = v
}
