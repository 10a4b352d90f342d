package allocate

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gpulink/gpulink/driver/topology"
)

// mixScale is what the weights of a SizeMix add up to. Weights are
// integers so that the fragmentation criterion sums and compares them
// exactly: the decision cannot depend on floating-point rounding, which
// differs between architectures that fuse multiply-adds and those that
// do not.
const mixScale = 1 << 20

// SizeMix is how often each request size (whole GPUs) is asked for, for
// example the recent requests a controller has seen in its cluster. The
// fragmentation criterion weights each future size by it, so that what is
// kept free is what will be asked for (doc.go, criterion 2). Build one with
// NewSizeMix; the zero value and nil mean DefaultSizeMix.
type SizeMix struct {
	// w[j] is the weight of size j, summing to about mixScale over all
	// sizes. Only sizes up to exactMaxFree are kept: larger sizes never
	// fit in what remains of an exact search.
	w [exactMaxFree + 1]uint32
	// set is false for the zero value.
	set bool
}

// DefaultSizeMix is the mix assumed when none is given: every size from 1
// to 8 equally often, the sizes one node of up to 8 GPUs can hold.
var DefaultSizeMix = mustSizeMix(map[int]float64{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1})

// NewSizeMix builds a mix from relative frequencies by size: any
// non-negative finite numbers (counts or shares), at least one positive.
// Sizes must be 1..topology.MaxGPUs.
func NewSizeMix(freq map[int]float64) (*SizeMix, error) {
	var total float64
	sizes := slices.Sorted(func(yield func(int) bool) {
		for s := range freq {
			if !yield(s) {
				return
			}
		}
	})
	var bad []string
	for _, s := range sizes {
		f := freq[s]
		switch {
		case s < 1 || s > topology.MaxGPUs:
			bad = append(bad, fmt.Sprintf("size %d: must be 1..%d", s, topology.MaxGPUs))
		case math.IsNaN(f) || math.IsInf(f, 0) || f < 0:
			bad = append(bad, fmt.Sprintf("size %d: frequency must be a finite number >= 0, got %v", s, f))
		default:
			total += f
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("size mix: %s", strings.Join(bad, "; "))
	}
	if total <= 0 || math.IsInf(total, 0) {
		return nil, fmt.Errorf("size mix: frequencies must add up to a positive finite number, got %v", total)
	}
	m := &SizeMix{set: true}
	for _, s := range sizes {
		if s <= exactMaxFree {
			m.w[s] = uint32(math.Round(freq[s] / total * mixScale))
		}
	}
	return m, nil
}

func mustSizeMix(freq map[int]float64) *SizeMix {
	m, err := NewSizeMix(freq)
	if err != nil {
		panic(err)
	}
	return m
}

// Weight is the share of requests of the given size, 0..1, as the
// allocator uses it (sizes above 16 read 0: they never matter).
func (m *SizeMix) Weight(size int) float64 {
	m = m.orDefault()
	if size < 0 || size > exactMaxFree {
		return 0
	}
	return float64(m.w[size]) / mixScale
}

func (m *SizeMix) orDefault() *SizeMix {
	if m == nil || !m.set {
		return DefaultSizeMix
	}
	return m
}

// levels are the bits, indexed by set size, of the future sizes criterion 3a
// looks at when k of f free GPUs are taken: sizes 2..f-k with a weight.
func (m *SizeMix) levels(f, k int) uint32 {
	m = m.orDefault()
	var lv uint32
	for j := 2; j <= f-k && j <= exactMaxFree; j++ {
		if m.w[j] > 0 {
			lv |= 1 << j
		}
	}
	return lv
}

// HoldSize returns held when next is within MixHoldDistance of it (the
// L1 distance of their weights), else next (held nil: next).
func HoldSize(held, next *SizeMix) *SizeMix {
	if held == nil || next == nil {
		return next
	}
	h, n := held.orDefault(), next.orDefault()
	var d int64
	for j := range h.w {
		diff := int64(h.w[j]) - int64(n.w[j])
		d += max(diff, -diff)
	}
	if float64(d) <= MixHoldDistance*mixScale {
		return held
	}
	return next
}

// String lists the sizes with a weight, as "size:percent".
func (m *SizeMix) String() string {
	m = m.orDefault()
	var parts []string
	for s, w := range m.w {
		if w > 0 {
			parts = append(parts, fmt.Sprintf("%d:%.1f%%", s, float64(w)*100/mixScale))
		}
	}
	return strings.Join(parts, " ")
}
