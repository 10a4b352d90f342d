package planner

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// Pods without GPU claims (Controller's PlaceCPUPods, --place-cpu-pods).
//
// A pod that asks for CPU and memory only takes them from whichever node
// kube-scheduler picks; on a GPU node that CPU and memory may be what a
// GPU pod to come needed, and the node's GPUs are then stranded. FGD's
// trace (docs/performance/trace.md) shows kube-scheduler's default
// spreading of such pods is most of the difference between the chart's
// placement and FGD's. DecideHost chooses for such a pod the node where
// it strands the least GPU (allocate.ChooseHost) among the nodes the pod
// could run on, as the node filter of GPU pods sees them.

// rejectNoHost counts nodes whose allocatable CPU or memory is unknown:
// ChooseHost needs both.
const rejectNoHost = "node(s) without allocatable cpu or memory"

// HostRequest is a pod without GPU claims to place.
type HostRequest struct {
	Pod *corev1.Pod
	// Nodes are the cluster's Node objects, GPU nodes or not.
	Nodes []*corev1.Node
}

// HostDecision is what DecideHost found.
type HostDecision struct {
	// Node is the chosen node; "" when no node passed the filter or none
	// of those that did has gpulink GPUs (nothing to strand, so nothing to
	// steer: kube-scheduler places the pod as it would).
	Node string
	// Candidates is how many nodes passed the filter, GPUNodes how many of
	// them have gpulink GPUs.
	Candidates, GPUNodes int
	// Rejections counts the nodes the filter turned down, by reason.
	Rejections *Rejections
}

// DecideHost chooses the node for a pod that asks for no gpulink device:
// among the nodes that pass the node filter (schedulable, node selector
// and required affinity, taints, CPU/memory/pods fit against the pods
// counted there, pod (anti-)affinity), the one where the pod's CPU and
// memory strand the least GPU for the recent GPU pods' shapes (with
// ranking by stranding; without it, the node with the least unallocated
// GPU, nodes without GPUs first), then the fullest. Call it under the
// same lock as Decide: it reads the ledger and the demand mix.
func (p *Planner) DecideHost(ctx context.Context, req HostRequest) (HostDecision, error) {
	logger := klog.FromContext(ctx)
	pf := p.filter.forPod(logger, req.Pod, nil, nil)
	d := HostDecision{Rejections: pf.rej}
	states := make([]*allocate.NodeState, 0, len(req.Nodes))
	for _, node := range req.Nodes {
		ni := p.inv.Node(node.Name)
		if ni == nil {
			// A node without GPUs: the filter reads only the node's name
			// from the inventory, the choice its tie key.
			ni = &NodeInventory{Node: node.Name, TieKey: p.inv.tieKeyOf(node.Name)}
		}
		if !pf.admit(ni) {
			continue
		}
		host := p.filter.HostLeft(node.Name)
		if host == nil {
			pf.skip(rejectNoHost, "node %s: allocatable cpu or memory not published", node.Name)
			continue
		}
		st := &allocate.NodeState{Name: node.Name, TieKey: ni.tie(), Host: host}
		if ni.Topo != nil && ni.Topo.Len() > 0 && len(ni.Devices) == ni.Topo.Len() {
			st.Topology = ni.Topo
			st.Usage = p.ledger.NodeUsage(ni)
			d.GPUNodes++
		}
		states = append(states, st)
	}
	d.Candidates = len(states)
	if d.GPUNodes == 0 {
		return d, nil
	}
	all := p.inv.All()
	pol := p.demand.policy(allocate.Policy{}, p.nodesNowOf(all))
	name, err := allocate.ChooseHost(states, podHost(req.Pod), pol)
	if unsat := (*allocate.UnsatisfiableError)(nil); errors.As(err, &unsat) {
		// The filter already checked the CPU and memory fit; a node
		// short of them here has pods counted since.
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("choosing a node for pod %s/%s without GPU claims: %w", req.Pod.Namespace, req.Pod.Name, err)
	}
	d.Node = name
	return d, nil
}
