package controller

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// seriesLabels returns the label values of every series of a counter
// vector, each series' values joined by "/", sorted.
func seriesLabels(t *testing.T, vec *prometheus.CounterVec) []string {
	t.Helper()
	ch := make(chan prometheus.Metric, 256)
	vec.Collect(ch)
	close(ch)
	var out []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		var vals []string
		for _, l := range pb.GetLabel() {
			vals = append(vals, l.GetValue())
		}
		if pb.GetCounter().GetValue() != 0 {
			vals = append(vals, "(nonzero)")
		}
		out = append(out, strings.Join(vals, "/"))
	}
	slices.Sort(out)
	return out
}

// TestLinkSeriesExistBeforeFirstAllocation: the allocations_total and
// below_best_link_total series a node's GPUs can produce exist at 0 once
// its slices are seen, one set per kind of node: pcie-4 (PIX pairs on a
// switch, SYS across sockets) and pcie-switch-8 (PIX, NODE within a
// socket, SYS across). Below the best set: 2 GPUs on NODE or SYS (PIX
// is best), 3-4 GPUs on SYS (NODE is best); from 5 GPUs SYS is the best.
func TestLinkSeriesExistBeforeFirstAllocation(t *testing.T) {
	h := newHarness(t, objs(classes(), gpuNode(t, "a", "pcie-4.txt"), gpuNode(t, "b", "pcie-switch-8.txt"), gpuNode(t, "c", "pcie-4.txt"))...).start()
	wantAlloc := []string{"NODE", "PIX", "SYS", "mig", "none", "share"}
	wantBelow := []string{"2/NODE", "2/SYS", "3/SYS", "4/SYS"}
	h.eventually("link series of both kinds of node", func() bool {
		return slices.Equal(seriesLabels(t, h.ctrl.metrics.Allocations), wantAlloc) &&
			slices.Equal(seriesLabels(t, h.ctrl.metrics.BelowBestLink), wantBelow)
	})
	h.ctrl.linkSeries.mu.Lock()
	kinds := len(h.ctrl.linkSeries.seen)
	h.ctrl.linkSeries.mu.Unlock()
	if got := kinds; got != 2 {
		t.Errorf("%d kinds of node seeded, want 2 (a and c are alike)", got)
	}
}
