package allocate

import (
	"math/bits"
	"sync"

	"github.com/gpulink/gpulink/driver/topology"
)

// longRunMaxSets bounds the ideal sets of one size the long-run criterion
// (doc.go, criterion 3d) looks at: a size with more of them on the node
// (all 4-GPU sets of an NVSwitch node, say) is left out, as there every
// set is as good as any other in the long run anyway and comparing pairs
// of them would cost more than the search.
const longRunMaxSets = 64

// longRunTable is, for one topology of at most exactMaxFree GPUs, the sets
// of each size on the node's ideal class for that size (the best weakest
// link an idle node gives it), in position numbering. A size whose every
// set is on its ideal class (the node's weakest link is that class) has
// none: any set serves it as well, whatever is taken.
type longRunTable struct {
	sets [exactMaxFree + 1][]uint64
}

// longRunMemo keeps the tables by topology and, so that nodes of one
// kind share one (a controller may hold a topology per node), by link
// matrix. Both are emptied when full.
var longRunMemo = struct {
	mu     sync.Mutex
	byTopo map[*topology.Topology]*longRunTable
	byKind map[kindKey]*longRunTable
}{byTopo: map[*topology.Topology]*longRunTable{}, byKind: map[kindKey]*longRunTable{}}

// longRunFor returns t's table, building it on first use for t's link
// matrix; nil for nodes of more than exactMaxFree GPUs and for nodes where
// no size has sets in the table (every pair on one link class: NVSwitch
// systems).
func longRunFor(t *topology.Topology) *longRunTable {
	n := t.Len()
	if n > exactMaxFree {
		return nil
	}
	longRunMemo.mu.Lock()
	lt, ok := longRunMemo.byTopo[t]
	longRunMemo.mu.Unlock()
	if ok {
		return lt
	}
	var l local
	l.load(t, fullMask(n))
	kk := makeKindKey(&l)
	longRunMemo.mu.Lock()
	lt, ok = longRunMemo.byKind[kk]
	longRunMemo.mu.Unlock()
	if !ok {
		lt = buildLongRun(t)
	}
	longRunMemo.mu.Lock()
	if len(longRunMemo.byTopo) >= memoMaxEntries {
		clear(longRunMemo.byTopo)
	}
	if len(longRunMemo.byKind) >= memoMaxEntries {
		clear(longRunMemo.byKind)
	}
	longRunMemo.byTopo[t] = lt
	longRunMemo.byKind[kk] = lt
	longRunMemo.mu.Unlock()
	return lt
}

func buildLongRun(t *topology.Topology) *longRunTable {
	n := t.Len()
	lt := &longRunTable{}
	var best [exactMaxFree + 1]uint8
	all := fullMask(n)
	floor := setKey(t, all).weak()
	for s := all; s != 0; s = (s - 1) & all {
		if j := bits.OnesCount64(s); j >= 2 {
			best[j] = max(best[j], setKey(t, s).weak())
		}
	}
	for s := all; s != 0; s = (s - 1) & all {
		j := bits.OnesCount64(s)
		if j < 2 || best[j] == floor || setKey(t, s).weak() < best[j] {
			continue
		}
		if len(lt.sets[j]) > longRunMaxSets {
			continue
		}
		lt.sets[j] = append(lt.sets[j], s)
	}
	empty := true
	for j := range lt.sets {
		if len(lt.sets[j]) > longRunMaxSets {
			lt.sets[j] = nil
		}
		empty = empty && len(lt.sets[j]) == 0
	}
	if empty {
		return nil
	}
	return lt
}

// value is criterion 3d for u, the node's GPUs outside the set taken:
// for each size j of the mix with ideal sets in the table, w_j * 2^20 when
// one of them lies in u, and for each size j2 of the mix w_j * w_j2 when
// one of size j and one of size j2 lie in u apart.
func (lt *longRunTable) value(u uint64, mix *SizeMix) uint64 {
	m := mix.orDefault()
	var v uint64
	for j1 := 2; j1 <= exactMaxFree; j1++ {
		if m.w[j1] == 0 || len(lt.sets[j1]) == 0 {
			continue
		}
		has := false
		for _, s := range lt.sets[j1] {
			if s&^u == 0 {
				has = true
				break
			}
		}
		if !has {
			continue
		}
		v += uint64(m.w[j1]) << 20
		for j2 := 2; j2 <= exactMaxFree; j2++ {
			if m.w[j2] == 0 || len(lt.sets[j2]) == 0 {
				continue
			}
			if lt.apart(u, j1, j2) {
				v += uint64(m.w[j1]) * uint64(m.w[j2])
			}
		}
	}
	return v
}

// apart tells whether u holds an ideal set of size j1 and one of size j2
// with no GPU in common.
func (lt *longRunTable) apart(u uint64, j1, j2 int) bool {
	for _, a := range lt.sets[j1] {
		if a&^u != 0 {
			continue
		}
		for _, b := range lt.sets[j2] {
			if b&^u == 0 && a&b == 0 {
				return true
			}
		}
	}
	return false
}
