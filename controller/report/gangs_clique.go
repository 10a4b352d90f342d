package report

import (
	"maps"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// WithPublishedCliques returns nodeLabels with the NVLink clique label
// (gang.LabelClique) of each node that lacks it set to the clique its
// gpulink devices publish (driver.AttrCliqueID), as the controller places
// gangs (controller/gang_clique.go): one clique shared by every device of
// the node that publishes one; none when they disagree. nodeLabels is not
// modified; changed nodes get copies of their labels.
func WithPublishedCliques(nodeLabels map[string]map[string]string, published []*resourceapi.ResourceSlice) map[string]map[string]string {
	clique := map[string]string{} // node -> clique; "" once they disagree
	for _, s := range published {
		if s.Spec.Driver != driver.Name || s.Spec.NodeName == nil {
			continue
		}
		node := *s.Spec.NodeName
		for i := range s.Spec.Devices {
			a, ok := s.Spec.Devices[i].Attributes[driver.AttrCliqueID]
			if !ok || a.StringValue == nil || *a.StringValue == "" {
				continue
			}
			if have, seen := clique[node]; seen && have != *a.StringValue {
				clique[node] = ""
				continue
			} else if !seen {
				clique[node] = *a.StringValue
			}
		}
	}
	out := maps.Clone(nodeLabels)
	if out == nil {
		out = map[string]map[string]string{}
	}
	for node, c := range clique {
		if c == "" || out[node][gang.LabelClique] != "" {
			continue
		}
		l := maps.Clone(out[node])
		if l == nil {
			l = map[string]string{}
		}
		l[gang.LabelClique] = c
		out[node] = l
	}
	return out
}
