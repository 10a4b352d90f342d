package allocate

import (
	"reflect"
	"strings"
	"testing"
)

func TestNewSizeHistoryErrors(t *testing.T) {
	for _, tc := range []struct {
		window, refresh int
		want            string
	}{
		{0, 1, "window must be at least 1, got 0"},
		{8, 0, "refresh must be 1..window (8), got 0"},
		{8, 9, "refresh must be 1..window (8), got 9"},
	} {
		if _, err := NewSizeHistory(tc.window, tc.refresh); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewSizeHistory(%d, %d) = %v, want an error containing %q", tc.window, tc.refresh, err, tc.want)
		}
	}
}

// TestSizeHistoryWindow: the mix counts the last window sizes plus the
// prior, and changes only every refresh sizes.
func TestSizeHistoryWindow(t *testing.T) {
	h, err := NewSizeHistory(4, 2)
	if err != nil {
		t.Fatal(err)
	}
	prior := map[int]int{1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
	if got := h.Counts(); !reflect.DeepEqual(got, prior) {
		t.Fatalf("empty history counts %v, want the prior %v", got, prior)
	}
	start := h.Mix()
	h.Record(2)
	if h.Mix() != start {
		t.Fatal("mix changed before refresh sizes were recorded")
	}
	h.Record(2)
	h.Record(0)  // ignored
	h.Record(65) // ignored
	if got, want := h.String(), "1:1 2:3 3:1 4:1 5:1 6:1 7:1 8:1"; got != want {
		t.Fatalf("after two pairs: %q, want %q", got, want)
	}
	for _, s := range []int{16, 16, 16, 4} {
		h.Record(s)
	}
	// The window (4) now holds 16, 16, 16, 4: both pairs dropped out.
	if got, want := h.String(), "1:1 2:1 3:1 4:2 5:1 6:1 7:1 8:1 16:3"; got != want {
		t.Fatalf("after the window turned over: %q, want %q", got, want)
	}
	if h.Recorded() != 6 {
		t.Fatalf("Recorded() = %d, want 6", h.Recorded())
	}
	if w := h.Mix().Weight(16); w < 0.249 || w > 0.251 {
		t.Fatalf("weight of 16 = %v, want 3/12", w)
	}
}

// TestSizeHistoryChangesDecision: on the P40 box (switches {0,1,2} and
// {3,4,5,6}) with 5 and 6 in use, a one-GPU request breaks the switch
// triple after a run of pair requests (two pairs stay) and keeps it after
// a run of triples; the same sequence always gives the same answer.
func TestSizeHistoryChangesDecision(t *testing.T) {
	node := nodeWith("node-a", p40(t), 5, 6)
	decide := func(size int) int {
		h, err := NewSizeHistory(DefaultHistoryWindow, DefaultHistoryRefresh)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 * DefaultHistoryRefresh {
			// Mostly size, some single GPUs.
			if i%4 == 0 {
				h.Record(1)
			} else {
				h.Record(size)
			}
		}
		r, err := Allocate(node, Request{GPUs: 1}, Policy{Mix: h.Mix()})
		if err != nil {
			t.Fatal(err)
		}
		return r.GPUs[0]
	}
	for _, tc := range []struct{ size, want int }{{2, 0}, {3, 3}} {
		for range 3 {
			if got := decide(tc.size); got != tc.want {
				t.Fatalf("after requests of %d GPUs: took GPU %d, want %d", tc.size, got, tc.want)
			}
		}
	}
}
