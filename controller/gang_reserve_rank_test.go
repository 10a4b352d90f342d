package controller

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/gang"
)

// TestStarvedGangOutranks: the higher level first, then the longer wait,
// then the key.
func TestStarvedGangOutranks(t *testing.T) {
	now := time.Now()
	leafOld := starvedGang{level: 3, since: now.Add(-2 * time.Hour)}
	leafNew := starvedGang{level: 3, since: now.Add(-time.Hour)}
	spineNew := starvedGang{level: 4, since: now.Add(-time.Hour)}
	for _, tc := range []struct {
		name string
		a, b starvedGang
		want bool
	}{
		{"a higher level outranks an older lower one", spineNew, leafOld, true},
		{"a lower level never outranks a higher one", leafOld, spineNew, false},
		{"the same level: the longer wait", leafOld, leafNew, true},
		{"the same level, the shorter wait", leafNew, leafOld, false},
		{"equal: the key decides", leafNew, leafNew, true},
	} {
		if got := tc.a.outranks(tc.b, "ns/labels/a", "ns/labels/b"); got != tc.want {
			t.Errorf("%s: outranks = %v, want %v", tc.name, got, tc.want)
		}
	}
	if leafNew.outranks(leafNew, "ns/labels/b", "ns/labels/a") {
		t.Error("equal gangs: both outrank each other")
	}
}

// spineNode is a leafNode in spine s1.
func spineNode(t *testing.T, name, leaf string) []runtime.Object {
	objs := leafNode(t, name, leaf)
	objs[0].(*corev1.Node).Labels[gang.LabelSpine] = "s1"
	return objs
}

// TestGangStarvationHigherLevelFirst: two gangs wait past the bound while
// a third holds the reservation: an older one that requires a leaf and a
// younger one that needs the spine. When the reservation ends, the
// spine-sized gang takes it: the leaf-sized one fits as soon as any leaf
// has two free nodes, which the churn of small pods leaves often, the
// spine-sized one only when the spine drains.
func TestGangStarvationHigherLevelFirst(t *testing.T) {
	cfg := Config{Workers: 2, DeviceTaintRules: true, Gangs: GangConfig{StarvationBound: 10 * time.Minute}}
	h := newHarnessWith(t, cfg, objs(classes(), spineNode(t, "a", "l1"), spineNode(t, "b", "l1"), spineNode(t, "c", "l2"), spineNode(t, "d", "l2"))...).start()
	// Singletons on a and c: each leaf has one free node, the spine two.
	h.singletonOn("single-a", "a", 4)
	h.singletonOn("single-c", "c", 4)
	starved := func(name string, size int, labels map[string]string, age time.Duration) {
		h.backdatedGang(name, name, size, 4, age, labels)
	}
	leaf := map[string]string{gangs.LabelLevel: gang.LabelLeaf}
	// "first" reserves: it is alone past the bound.
	starved("first", 2, leaf, 3*time.Hour)
	h.waitEventWith(ns+"/first0", report.ReasonGangReserved, "reserving leaf l1")
	// Both wait past the bound while "first" holds the reservation.
	starved("older", 2, leaf, 2*time.Hour)
	starved("big", 3, nil, time.Hour)
	h.eventually("both gangs recorded as starved", func() bool {
		h.ctrl.reserve.mu.Lock()
		defer h.ctrl.reserve.mu.Unlock()
		_, older := h.ctrl.reserve.starved[ns+"/labels/older"]
		_, big := h.ctrl.reserve.starved[ns+"/labels/big"]
		return older && big
	})
	if _, ok := h.rec.find(ns+"/older0", report.ReasonGangReserved); ok {
		t.Fatal("gang older reserved while gang first held the reservation")
	}
	// "first" gives up: the reservation is free for the other two.
	for i := range 2 {
		if err := h.client.CoreV1().Pods(ns).Delete(h.ctx, fmt.Sprintf("first%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e := h.waitEventWith(ns+"/big0", report.ReasonGangReserved, "reserving spine s1")
	if !contains(e.Note, "gang big waited") {
		t.Errorf("reservation event %q, want it to name gang big", e.Note)
	}
	h.settle()
	if e, ok := h.rec.find(ns+"/older0", report.ReasonGangReserved); ok {
		t.Errorf("gang older reserved too (%q): one gang reserves at a time, the spine-sized one first", e.Note)
	}
	h.ctrl.reserve.mu.Lock()
	holder := h.ctrl.reserve.gangKey
	h.ctrl.reserve.mu.Unlock()
	if holder != ns+"/labels/big" {
		t.Errorf("reservation held by %q, want gang big", holder)
	}
}
