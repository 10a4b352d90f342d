package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
)

func TestTopologyTieKey(t *testing.T) {
	h := gang.DefaultHierarchy()
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	for _, tc := range []struct {
		name string
		node *corev1.Node
		// domains, tightest first: clique, accelerator, leaf, spine, zone.
		want []string
	}{
		{"no labels", node("n", nil), []string{"", "", "", "", ""}},
		{"leaf and spine", node("n", map[string]string{gang.LabelLeaf: "l1", gang.LabelSpine: "s0"}), []string{"", "", "l1", "s0", ""}},
		{"every level", node("n", map[string]string{
			gang.LabelZone: "z", gang.LabelSpine: "s", gang.LabelLeaf: "l", gang.LabelAccelerator: "a", gang.LabelClique: "c.1",
		}), []string{"c.1", "a", "l", "s", "z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := topologyTieKey(h, tc.node), allocate.TopologyTieKey(tc.want, tc.node.Name); got != want {
				t.Errorf("topologyTieKey = %q, want %q", got, want)
			}
		})
	}
}

// TestSinglesFillOneLeafWhateverTheNames: nodes named across two leaves
// (a and c in l2, b and d in l1), all idle and alike. Two pods of a whole
// node each fill one leaf (l1, the first by the hierarchy) rather than the
// first two names (a in l2, b in l1), so a gang that needs a whole leaf
// still fits in l2. A node moved to another leaf is ordered by its new
// leaf.
func TestSinglesFillOneLeafWhateverTheNames(t *testing.T) {
	h := newHarness(t, objs(classes(), leafNode(t, "a", "l2"), leafNode(t, "b", "l1"), leafNode(t, "c", "l2"), leafNode(t, "d", "l1"))...).start()
	for _, name := range []string{"p1", "p2"} {
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
		h.pod(name, true, name)
		h.waitUngated(name)
	}
	if nodes := h.allocatedNodes("p1", "p2"); nodes["p1"] != "b" || nodes["p2"] != "d" {
		t.Errorf("singles on %v, want b and d: leaf l1 filled first, l2 kept whole", nodes)
	}
	req := map[string]string{gangs.LabelLevel: "leaf"}
	h.gangPod("g0", "train", 2, 4, req)
	h.gangPod("g1", "train", 2, 4, req)
	h.waitUngated("g0")
	h.waitUngated("g1")
	if nodes := h.allocatedNodes("g0", "g1"); !sameSet([]string{nodes["g0"], nodes["g1"]}, "a", "c") {
		t.Errorf("gang on %v, want a and c (leaf l2)", nodes)
	}

	// Node e joins leaf l0, ahead of every other leaf: an idle pair of
	// GPUs goes there, not to a name before it.
	h2 := newHarness(t, objs(classes(), leafNode(t, "a", "l2"), leafNode(t, "e", "l3"))...).start()
	e, err := h2.client.CoreV1().Nodes().Get(h2.ctx, "e", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.Labels[gang.LabelLeaf] = "l0"
	if _, err := h2.client.CoreV1().Nodes().Update(h2.ctx, e, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h2.eventually("e's tie key follows its new leaf", func() bool {
		n := h2.ctrl.inv.Node("e")
		return n != nil && n.TieKey == topologyTieKey(h2.ctrl.hierarchy, e)
	})
	h2.claim("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	h2.pod("pair", true, "pair")
	h2.waitUngated("pair")
	if node := allocatedNode(h2.getClaim("pair")); node != "e" {
		t.Errorf("pair on %s, want e (leaf l0, first by the hierarchy)", node)
	}
}

// sameSet tells whether got holds exactly want, in any order.
func sameSet(got []string, want ...string) bool {
	return len(got) == len(want) && sets.New(got...).Equal(sets.New(want...))
}
