package report

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// cliqueSlice is a gpulink slice of node whose devices publish the given
// cliques ("" for a device without one).
func cliqueSlice(node string, cliques ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: driver.Name, NodeName: ptr.To(node)}}
	for i, c := range cliques {
		d := resourceapi.Device{Name: driver.DeviceName(i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
		if c != "" {
			d.Attributes[driver.AttrCliqueID] = resourceapi.DeviceAttribute{StringValue: ptr.To(c)}
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
	}
	return s
}

// `gpulink inspect` places unlabelled nodes in the clique their devices
// publish, as the controller does: a labelled node keeps its label, a
// node whose devices disagree gets none, and the input is not modified.
func TestWithPublishedCliques(t *testing.T) {
	labels := map[string]map[string]string{
		"a": {"x": "1"},
		"b": {gang.LabelClique: "labelled"},
		"c": nil,
	}
	published := []*resourceapi.ResourceSlice{
		cliqueSlice("a", "k.1", "", "k.1"),
		cliqueSlice("b", "k.1"),
		cliqueSlice("c", "k.1", "k.2"),
		cliqueSlice("d", "k.3"),
	}
	got := WithPublishedCliques(labels, published)
	for node, want := range map[string]string{"a": "k.1", "b": "labelled", "c": "", "d": "k.3"} {
		if v := got[node][gang.LabelClique]; v != want {
			t.Errorf("node %s: clique %q, want %q", node, v, want)
		}
	}
	if got["a"]["x"] != "1" {
		t.Errorf("node a lost its labels: %v", got["a"])
	}
	if _, ok := labels["a"][gang.LabelClique]; ok || labels["d"] != nil {
		t.Errorf("input modified: %v", labels)
	}
	h := gang.DefaultHierarchy()
	if level, domain := spanned(h, []string{"a", "d"}, got); h.Name(level) != "cluster" || domain != "" {
		t.Errorf("a and d span %s %q, want the cluster", h.Name(level), domain)
	}
	got["e"] = map[string]string{gang.LabelClique: "k.1"}
	if level, domain := spanned(h, []string{"a", "e"}, got); h.Name(level) != "clique" || domain != "k.1" {
		t.Errorf("a and e span %s %q, want clique k.1", h.Name(level), domain)
	}
}
