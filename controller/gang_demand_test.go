package controller

import (
	"fmt"
	"testing"

	"github.com/gpulink/gpulink/driver/gang"
)

// TestGangDemand: each gang counts once, the window keeps the last
// gangDemandWindow gangs, and shapes are counted largest first.
func TestGangDemand(t *testing.T) {
	var d gangDemand
	d.record("a", 4, 8)
	d.record("a", 4, 8)
	d.record("b", 2, 8)
	d.record("c", 4, 8)
	if got, want := fmt.Sprint(d.shapes()), fmt.Sprint([]gang.Shape{{Pods: 4, GPUsPerPod: 8, Count: 2}, {Pods: 2, GPUsPerPod: 8, Count: 1}}); got != want {
		t.Errorf("shapes %s, want %s", got, want)
	}
	for i := range gangDemandWindow {
		d.record(fmt.Sprintf("x%d", i), 1, 1)
	}
	if got, want := fmt.Sprint(d.shapes()), fmt.Sprint([]gang.Shape{{Pods: 1, GPUsPerPod: 1, Count: gangDemandWindow}}); got != want {
		t.Errorf("after the window: %s, want %s", got, want)
	}
	// "a" left the window: it counts again when it comes back.
	d.record("a", 4, 8)
	if s := d.shapes(); s[0].Pods != 4 || s[0].Count != 1 {
		t.Errorf("a returning: %v", s)
	}
}
