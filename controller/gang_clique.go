package controller

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/gang"
)

// NVLink cliques in the gang hierarchy.
//
// The hierarchy's clique level (gang.LabelClique, nvidia.com/gpu.clique)
// comes from the node label GPU Feature Discovery sets on GB200/GB300
// NVL72 nodes. Clusters without GPU Feature Discovery still know each
// node's clique: the kubelet plugin publishes it on every GPU
// (driver.AttrCliqueID, from NVML's fabric info, in the label's format).
// A node without the label is placed in the clique its GPUs publish, so
// the level works from either source, and nodes labelled and unlabelled
// in one clique share one domain. The label wins where both are set (an
// operator may group nodes on purpose).

// nodeDomains is the node's domain per hierarchy level (as
// gang.Node.Domains wants them): its labels', with the clique level taken
// from its GPUs' published clique where the label is missing. inv is the
// node's inventory (nil: none known).
func (c *Controller) nodeDomains(node *corev1.Node, inv *planner.NodeInventory) []string {
	return c.withPublishedClique(c.hierarchy.Domains(node.Labels), inv)
}

// withPublishedClique fills the clique level of the node's domains d from
// its GPUs' published clique where the label left it empty. d may be the
// decision's shared, read-only copy (nodeDomains' cache), so it is cloned
// before it is changed.
func (c *Controller) withPublishedClique(d []string, inv *planner.NodeInventory) []string {
	level, ok := c.hierarchy.LevelOfKey(gang.LabelClique)
	if !ok || d[level-1] != "" || inv == nil {
		return d
	}
	clique := inv.Clique()
	if clique == "" {
		return d
	}
	d = slices.Clone(d)
	d[level-1] = clique
	return d
}

// nodeDomain is the node's domain at the hierarchy level of label key
// key, as nodeDomains gives it.
func (c *Controller) nodeDomain(node *corev1.Node, key string) string {
	if v := node.Labels[key]; v != "" || key != gang.LabelClique {
		return v
	}
	if _, ok := c.hierarchy.LevelOfKey(key); !ok {
		return ""
	}
	if inv := c.inv.Node(node.Name); inv != nil {
		return inv.Clique()
	}
	return ""
}
