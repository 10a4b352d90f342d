package planner

import (
	"fmt"
	"sort"
	"strings"
)

// Rejections counts, per filter reason, the nodes ruled out for a pod, for
// a message like kube-scheduler's: "0/12 nodes: 5 Insufficient cpu, 3 no
// 4 free GPUs with every pair NVLink".
type Rejections struct {
	counts  map[string]int
	Details []string
}

func (r *Rejections) add(reason string) {
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[reason]++
}

// detail keeps a per-node explanation (a few are shown).
func (r *Rejections) detail(format string, args ...any) {
	if len(r.Details) < 8 {
		r.Details = append(r.Details, fmt.Sprintf(format, args...))
	}
}

func (r *Rejections) count(reason string) int { return r.counts[reason] }

// HeldOffByReservation tells whether some node was turned down only
// because a gang's starvation reservation holds it: the filter asks
// about the reservation last (NodeFilter.Reserved).
func (r *Rejections) HeldOffByReservation() bool {
	return r != nil && r.count(rejectReserved) > 0
}

// summary renders "0/N nodes: 5 Insufficient cpu, 3 ...", most frequent
// reason first, ties by reason.
func (r *Rejections) summary(total int) string {
	return fmt.Sprintf("0/%d nodes: %s", total, r.Reasons())
}

// Reasons renders the counts alone: "5 Insufficient cpu, 3 ...".
func (r *Rejections) Reasons() string {
	reasons := make([]string, 0, len(r.counts))
	for k := range r.counts {
		reasons = append(reasons, k)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if ci, cj := r.counts[reasons[i]], r.counts[reasons[j]]; ci != cj {
			return ci > cj
		}
		return reasons[i] < reasons[j]
	})
	parts := make([]string, len(reasons))
	for i, k := range reasons {
		parts[i] = fmt.Sprintf("%d %s", r.counts[k], k)
	}
	return strings.Join(parts, ", ")
}
