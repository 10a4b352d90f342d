package allocate

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSelectBeam checks the linear-time selection against its definition:
// the best quota per lowest GPU, then the best of the rest, by sorting.
func TestSelectBeam(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name       string
		states     int
		candidates int
		keys       int // distinct keys, few to force ties
	}{
		{"many ties", 500, 32, 2},
		{"distinct keys", 300, 16, 1000},
		{"one GPU per anchor", 2000, 64, 5},
		{"just over the width", beamWidth + 1, 9, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[uint64]bool{}
			var next []beamState
			for len(next) < tc.states {
				set := rng.Uint64() & fullMask(tc.candidates)
				if set == 0 || seen[set] {
					continue
				}
				seen[set] = true
				next = append(next, newBeamState(set, makeKey(uint8(1+rng.IntN(tc.keys)), uint32(rng.IntN(3)))))
			}
			want := referenceSelect(slices.Clone(next), tc.candidates)
			sc := &scratch{}
			got := sc.selectBeam(slices.Clone(next), tc.candidates)
			sortBest(got)
			if !slices.Equal(got, want) {
				t.Fatalf("selectBeam kept %d states, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
			}
		})
	}
}

func sortBest(s []beamState) {
	slices.SortFunc(s, func(a, b beamState) int {
		switch {
		case a.better(b):
			return -1
		case b.better(a):
			return 1
		}
		return 0
	})
}

func referenceSelect(next []beamState, candidates int) []beamState {
	sortBest(next)
	quota := min(maxPerAnchor, max(1, beamWidth/candidates))
	count := map[int]int{}
	var kept, rest []beamState
	for _, s := range next {
		a := bits.TrailingZeros64(s.set)
		if count[a] < quota {
			count[a]++
			kept = append(kept, s)
		} else {
			rest = append(rest, s)
		}
	}
	kept = append(kept, rest[:max(0, min(len(rest), beamWidth-len(kept)))]...)
	sortBest(kept)
	return kept
}

func firstDiff(a, b []beamState) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestSetTable(t *testing.T) {
	var h setTable
	for round := range 3 {
		h.reset(100 * (round + 1))
		for i := uint64(1); i <= 150; i++ {
			if !h.insert(i * 0x10001) {
				t.Fatalf("round %d: %d reported as seen before", round, i)
			}
		}
		for i := uint64(1); i <= 150; i++ {
			if h.insert(i * 0x10001) {
				t.Fatalf("round %d: %d reported as new twice", round, i)
			}
		}
	}
}
