package gang

import (
	"fmt"
	"testing"
)

// TestDemandHistory: each gang counts once, the window keeps the last
// Window gangs, a gang that left it counts again, and shapes come the
// most GPUs first.
func TestDemandHistory(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window int
		record [][3]any // key, pods, GPUs per pod
		want   []Shape
	}{
		{"empty", 0, nil, []Shape{}},
		{"each gang once", 0, [][3]any{{"a", 4, 8}, {"a", 4, 8}, {"b", 2, 8}, {"c", 4, 8}},
			[]Shape{{Pods: 4, GPUsPerPod: 8, Count: 2}, {Pods: 2, GPUsPerPod: 8, Count: 1}}},
		{"most GPUs first, then most pods", 0, [][3]any{{"a", 2, 8}, {"b", 16, 1}, {"c", 8, 2}, {"d", 32, 8}},
			[]Shape{{Pods: 32, GPUsPerPod: 8, Count: 1}, {Pods: 16, GPUsPerPod: 1, Count: 1}, {Pods: 8, GPUsPerPod: 2, Count: 1}, {Pods: 2, GPUsPerPod: 8, Count: 1}}},
		{"no pods: not recorded", 0, [][3]any{{"a", 0, 8}}, []Shape{}},
		{"window of 2: the oldest leaves", 2, [][3]any{{"a", 4, 8}, {"b", 2, 8}, {"c", 2, 8}},
			[]Shape{{Pods: 2, GPUsPerPod: 8, Count: 2}}},
		{"a gang that left counts again", 2, [][3]any{{"a", 4, 8}, {"b", 2, 8}, {"c", 2, 8}, {"a", 4, 8}},
			[]Shape{{Pods: 4, GPUsPerPod: 8, Count: 1}, {Pods: 2, GPUsPerPod: 8, Count: 1}}},
	} {
		d := DemandHistory{Window: tc.window}
		for _, r := range tc.record {
			d.Record(r[0].(string), r[1].(int), r[2].(int))
		}
		if got, want := fmt.Sprint(d.Shapes()), fmt.Sprint(tc.want); got != want {
			t.Errorf("%s: shapes %s, want %s", tc.name, got, want)
		}
	}
	// The zero value keeps DefaultDemandWindow gangs.
	var d DemandHistory
	d.Record("first", 4, 8)
	for i := range DefaultDemandWindow - 1 {
		d.Record(fmt.Sprintf("x%d", i), 1, 1)
	}
	if s := d.Shapes(); len(s) != 2 || s[0].Pods != 4 {
		t.Errorf("full default window: %v, want the first gang still in", s)
	}
	d.Record("one more", 1, 1)
	if s := d.Shapes(); len(s) != 1 || s[0].Count != DefaultDemandWindow {
		t.Errorf("past the default window: %v, want only 1 × 1 shapes", s)
	}
}
