package controller

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
)

// topologyTieKey is the key node is ordered by among nodes a decision
// scores alike (an idle node is as good as any other idle node of its
// kind): its domains in the gang hierarchy, widest first, then its name
// (allocate.TopologyTieKey). Ordering ties by the bare name filled nodes
// across every leaf and NVLink domain wherever the names did not follow
// the topology, breaking up the domains gangs need; by the hierarchy, a
// pod outside any gang fills one domain before opening the next, whatever
// the nodes are called.
func topologyTieKey(h *gang.Hierarchy, node *corev1.Node) string {
	return allocate.TopologyTieKey(h.Domains(node.Labels), node.Name)
}

// setTieKey keeps the planner's tie key of node in step with its labels.
func (c *Controller) setTieKey(node *corev1.Node) {
	c.inv.SetTieKey(node.Name, topologyTieKey(c.hierarchy, node))
}
