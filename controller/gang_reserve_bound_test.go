package controller

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestStarvationBoundByConstraint: a gang under Required waits
// StarvationBound before it may reserve, any other gang
// PreferredStarvationBound when one is set; a StarvationBound of 0 turns
// reservations off for both.
func TestStarvationBoundByConstraint(t *testing.T) {
	for _, tc := range []struct {
		name            string
		base, preferred time.Duration
		constraint      gang.Constraint
		want            time.Duration
	}{
		{"required", 15 * time.Minute, 4 * time.Hour, gang.Required, 15 * time.Minute},
		{"preferred", 15 * time.Minute, 4 * time.Hour, gang.Preferred, 4 * time.Hour},
		{"no level", 15 * time.Minute, 4 * time.Hour, gang.None, 4 * time.Hour},
		{"preferred, no bound of its own", 15 * time.Minute, 0, gang.Preferred, 15 * time.Minute},
		{"reservations off", 0, 4 * time.Hour, gang.Preferred, 0},
	} {
		c := &Controller{gangCfg: GangConfig{StarvationBound: tc.base, PreferredStarvationBound: tc.preferred}}
		if got := c.starvationBound(gang.Request{Constraint: tc.constraint}); got != tc.want {
			t.Errorf("%s: bound %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestPreferredGangReservesAfterItsBound: leaf l1 (a, b) with pod "old"
// on 2 of a's 4 GPUs; a gang of 2 pods × 4 GPUs waits. The starvation
// bound is 10 minutes, the preferred one 2 hours. A gang with no level
// that has waited an hour reserves nothing, so a 2-GPU singleton is
// placed beside "old"; the same gang after 3 hours, and a gang requiring
// the leaf after an hour, reserve the leaf, each naming its bound.
func TestPreferredGangReservesAfterItsBound(t *testing.T) {
	required := map[string]string{gangs.LabelLevel: gang.LabelLeaf}
	for _, tc := range []struct {
		name      string
		waited    time.Duration
		labels    map[string]string
		wantBound string // "": no reservation
	}{
		{"no level, an hour", time.Hour, nil, ""},
		{"no level, 3 hours", 3 * time.Hour, nil, "starvation bound 2h0m0s"},
		{"required leaf, an hour", time.Hour, required, "starvation bound 10m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{StarvationBound: 10 * time.Minute, PreferredStarvationBound: 2 * time.Hour}}
			h := newHarnessWith(t, cfg, objs(classes(), leafNode(t, "a", "l1"), leafNode(t, "b", "l1"))...).start()
			h.singletonOn("old", "a", 2)
			h.backdatedGang("g", "starved", 2, 4, tc.waited, tc.labels)
			if tc.wantBound != "" {
				e := h.waitEvent(ns+"/g0", report.ReasonGangReserved)
				if !contains(e.Note, tc.wantBound) || !contains(e.Note, "reserving leaf l1") {
					t.Errorf("reservation event %q, want leaf l1 and the %s", e.Note, tc.wantBound)
				}
				return
			}
			h.waitEventWith(ns+"/g0", report.ReasonGangWaiting, "2 pods")
			h.claim("late", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
			h.pod("late", true, "late")
			h.waitUngated("late")
			h.settle()
			if got := testutil.ToFloat64(h.ctrl.metrics.GangReservations); got != 0 {
				t.Errorf("gang_reservations_total %v within the preferred bound, want 0", got)
			}
		})
	}
}
