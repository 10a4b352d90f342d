package planner

import (
	corev1 "k8s.io/api/core/v1"
)

// Host ports in the node fit.
//
// kube-scheduler's NodePorts plugin refuses a pod on a node where a pod
// it counts there already uses one of the pod's host ports. gpulink
// decides a GPU pod's node when it writes its claims' allocations, so it
// checks the same: otherwise a pod with a hostPort (a gang of NCCL or MPI
// workers, say) gets GPUs on a node kube-scheduler then refuses it, and a
// gang of such pods packed on one node runs in part. k8s.io/kubernetes'
// own helpers are not importable here (its staging replacements), so the
// rule is restated: a pod's host ports are its containers' and sidecar
// init containers' ports with a hostPort (util.GetHostPorts), and two
// conflict when protocol and port are equal and either host IP is
// 0.0.0.0 (or empty) or both are the same (framework.HostPortInfo).

// fitPortsConflict is kube-scheduler's NodePorts reason.
const fitPortsConflict = "node(s) didn't have free ports for the requested pod ports"

// bindAll is the host IP binding every address.
const bindAll = "0.0.0.0"

// hostPort is one port a pod takes on its node, sanitized as
// kube-scheduler does: an empty IP binds all, an empty protocol is TCP.
type hostPort struct {
	ip       string
	protocol corev1.Protocol
	port     int32
}

// podHostPorts returns the host ports the pod takes on its node. A pod on
// the host's network takes its containers' ports even without a hostPort:
// the API server defaults hostPort to containerPort for such pods, which
// a pod object not from the API server (a test's) may lack.
func podHostPorts(pod *corev1.Pod) []hostPort {
	var out []hostPort
	add := func(c *corev1.Container) {
		for _, p := range c.Ports {
			port := p.HostPort
			if port == 0 && pod.Spec.HostNetwork {
				port = p.ContainerPort
			}
			if port <= 0 {
				continue
			}
			hp := hostPort{ip: p.HostIP, protocol: p.Protocol, port: port}
			if hp.ip == "" {
				hp.ip = bindAll
			}
			if hp.protocol == "" {
				hp.protocol = corev1.ProtocolTCP
			}
			out = append(out, hp)
		}
	}
	for i := range pod.Spec.InitContainers {
		// Only init containers that run as long as the pod (sidecars)
		// hold their ports, as kube-scheduler counts them.
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}

// portUse counts the host ports of the pods counted on a node. Counted,
// not a set: two pods the API lets on one node with one port (bound by
// nodeName, bypassing kube-scheduler) each hold it until both are gone.
type portUse map[hostPort]int

func (u portUse) add(ports []hostPort, delta int) {
	for _, p := range ports {
		u[p] += delta
		if u[p] <= 0 {
			delete(u, p)
		}
	}
}

// conflict tells whether p conflicts with a port in use, other than those
// of skip (the pod itself, when it is counted on the node already).
func (u portUse) conflict(p hostPort, skip []hostPort) bool {
	held := func(q hostPort) bool {
		n := u[q]
		for _, s := range skip {
			if s == q {
				n--
			}
		}
		return n > 0
	}
	if p.ip == bindAll {
		for q := range u {
			if q.protocol == p.protocol && q.port == p.port && held(q) {
				return true
			}
		}
		return false
	}
	return held(p) || held(hostPort{ip: bindAll, protocol: p.protocol, port: p.port})
}

// portsConflict tells whether any of want conflicts with the ports in use
// on the node (nil: none in use).
func portsConflict(u portUse, want, skip []hostPort) bool {
	if len(u) == 0 {
		return false
	}
	for _, p := range want {
		if u.conflict(p, skip) {
			return true
		}
	}
	return false
}

// HasHostPorts tells whether the pod takes host ports on its node, so that
// two copies of it never share one.
func HasHostPorts(pod *corev1.Pod) bool {
	return len(podHostPorts(pod)) > 0
}
