//go:build integration

package controller_test

import (
	"testing"
	"time"

	"github.com/gpulink/gpulink/driver/gang"
)

// TestGangReplacementJoinsLeaf: a 3-pod gang in one leaf runs in l2 (l1
// has one free node: a1 and a2 are taken). One of its pods is deleted, as
// a failed rank is, and a replacement created into the gang: with fewer
// than minCount placed it is decided as the missing part of the gang, as
// close to its placed pods as it fits, and kube-scheduler binds it in l2,
// not on a3, the tightest fit for a lone pod. Required: before that rule
// gpulink allocated it on a3; through the labels it was bound there; with
// a PodGroup, whose leaf topology constraint kube-scheduler applies too,
// kube-scheduler refused it and gpulink placed it again in l2. Preferred
// (gpulink's labels): before the rule it was bound on a3.
func TestGangReplacementJoinsLeaf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		required bool
	}{
		{name: "required", required: true},
		{name: "preferred"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := gangCluster(t)
			ctrl := e.startController(4)
			defer ctrl.stop()
			e.blocker("block-a1", e.node("a1"))
			e.blocker("block-a2", e.node("a2"))

			// Preferred is said in gpulink's labels (gangOf), also on a
			// PodGroup's pods.
			g := gangOf{Name: "train", Size: 3, PodGroup: true, Level: gang.LabelLeaf, Required: tc.required}
			pods := e.gangPodsOf(g)
			for _, n := range e.boundNodes(pods, 2*time.Minute) {
				if l := e.leafOf(t, n); l != "l2" {
					t.Fatalf("gang pod on %s (leaf %s), want leaf l2", n, l)
				}
			}
			e.deletePod(pods[1])
			g.First, g.Count = 3, 1
			replacement := e.gangPodsOf(g)[0]
			node := e.waitBound(replacement, 2*time.Minute).Spec.NodeName
			if l := e.leafOf(t, node); l != "l2" {
				t.Errorf("replacement bound on %s (leaf %s), want leaf l2 with the gang's other pods", node, l)
			}
			ev := e.waitEvent(replacement, "pods placed before share", 30*time.Second)
			t.Logf("replacement on %s: %s", node, ev)
			if err := e.checkInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}
