package report

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// Gang is one gang as `gpulink inspect` shows it: its pods, the nodes they
// are placed on (bound, or allocated by the controller and not bound yet)
// and the level of the hierarchy the placed pods span, their link class
// across nodes.
type Gang struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Source is PodGroup or labels (gangs.Source).
	Source string `json:"source"`
	// MinCount is the gang's size: its labels' or its PodGroup's (0 when
	// the PodGroup could not be read).
	MinCount int       `json:"minCount,omitempty"`
	Pods     []GangPod `json:"pods"`
	// Placed counts the pods with a node.
	Placed int `json:"placed"`
	// Level is the name of the lowest level all placed pods share
	// ("node", "clique", "leaf", ..., "cluster"), Domain its label value
	// ("" for the cluster); empty while no pod is placed.
	Level  string `json:"level,omitempty"`
	Domain string `json:"domain,omitempty"`
	// Nodes is the number of distinct nodes of the placed pods.
	Nodes int `json:"nodes"`
}

// GangPod is one pod of a gang.
type GangPod struct {
	Name string `json:"name"`
	// Node is where it runs or its claims are allocated; "" while it waits.
	Node string `json:"node,omitempty"`
	// Gated: still behind gpulink's scheduling gate.
	Gated bool `json:"gated"`
}

// Gangs groups the pods of gangs (gangs.Resolve) and finds each gang's
// placement and level in h from the nodes' labels. A pod's node is its
// spec.nodeName, else the node of a gpulink claim reserved for it.
// podGroups finds the PodGroups the pods name (nil: not read): a PodGroup
// of the basic policy is no gang (Kubernetes 1.37's Job controller puts
// every Job's pods in one with WorkloadWithJob) unless its pods carry gang
// labels, and a gang PodGroup gives the gang its minCount.
func Gangs(pods []*corev1.Pod, claims []*resourceapi.ResourceClaim, nodeLabels map[string]map[string]string, h *gang.Hierarchy, podGroups gangs.PodGroupLookup) []Gang {
	allocatedOn := map[string]string{} // pod UID -> node
	for _, c := range claims {
		a := c.Status.Allocation
		if a == nil {
			continue
		}
		node := ""
		for _, r := range a.Devices.Results {
			if r.Driver == driver.Name {
				node = r.Pool
				break
			}
		}
		if node == "" {
			continue
		}
		for _, r := range c.Status.ReservedFor {
			if r.Resource == "pods" {
				allocatedOn[string(r.UID)] = node
			}
		}
	}
	byKey := map[string]*Gang{}
	for _, p := range pods {
		ref, ok := gangs.Resolve(p, true, podGroups)
		if !ok || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		// Resolve left out basic PodGroups: a PodGroup found here is a gang.
		var pg *schedulingv1beta1.PodGroup
		if ref.Source == gangs.SourcePodGroup && podGroups != nil {
			if found, ok := podGroups(ref.Namespace, ref.Name); ok && found.Spec.SchedulingPolicy.Gang != nil {
				pg = found
			}
		}
		g := byKey[ref.Key()]
		if g == nil {
			g = &Gang{Namespace: ref.Namespace, Name: ref.Name, Source: string(ref.Source)}
			switch {
			case pg != nil:
				g.MinCount = int(pg.Spec.SchedulingPolicy.Gang.MinCount)
			case ref.Source == gangs.SourceLabels:
				if s, err := gangs.FromLabels(ref, p); err == nil {
					g.MinCount = s.MinCount
				}
			}
			byKey[ref.Key()] = g
		}
		gp := GangPod{Name: p.Name, Node: p.Spec.NodeName}
		if gp.Node == "" {
			gp.Node = allocatedOn[string(p.UID)]
		}
		for _, sg := range p.Spec.SchedulingGates {
			if sg.Name == driver.SchedulingGate {
				gp.Gated = true
			}
		}
		g.Pods = append(g.Pods, gp)
	}
	out := make([]Gang, 0, len(byKey))
	for _, g := range byKey {
		slices.SortFunc(g.Pods, func(a, b GangPod) int { return cmp.Compare(a.Name, b.Name) })
		var nodes []string
		for _, p := range g.Pods {
			if p.Node != "" {
				g.Placed++
				if !slices.Contains(nodes, p.Node) {
					nodes = append(nodes, p.Node)
				}
			}
		}
		g.Nodes = len(nodes)
		if len(nodes) > 0 {
			level, domain := spanned(h, nodes, nodeLabels)
			g.Level, g.Domain = h.Name(level), domain
		}
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b Gang) int { return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) })
	return out
}

// spanned is the lowest level of h whose domain holds every node, and
// that domain's label value (the node's name at level 0).
func spanned(h *gang.Hierarchy, nodes []string, nodeLabels map[string]map[string]string) (int, string) {
	if len(nodes) == 1 {
		return 0, nodes[0]
	}
	for l := 1; l < h.Cluster(); l++ {
		key := h.Key(l)
		v := nodeLabels[nodes[0]][key]
		same := v != ""
		for _, n := range nodes[1:] {
			same = same && nodeLabels[n][key] == v
		}
		if same {
			return l, v
		}
	}
	return h.Cluster(), ""
}
