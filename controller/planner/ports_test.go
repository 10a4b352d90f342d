package planner

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// withPorts gives the pod's first container the ports.
func withPorts(p *corev1.Pod, ports ...corev1.ContainerPort) *corev1.Pod {
	p.Spec.Containers[0].Ports = ports
	return p
}

func tcp(port int32) corev1.ContainerPort {
	return corev1.ContainerPort{ContainerPort: port, HostPort: port}
}

// The conflict rule is kube-scheduler's NodePorts: same protocol and
// port, and the host IPs equal or either binding all addresses.
func TestHostPortConflict(t *testing.T) {
	cases := []struct {
		name       string
		used, want corev1.ContainerPort
		conflict   bool
	}{
		{"same port, both all addresses", tcp(8080), tcp(8080), true},
		{"other port", tcp(8080), tcp(8081), false},
		{"other protocol", tcp(8080), corev1.ContainerPort{HostPort: 8080, Protocol: corev1.ProtocolUDP}, false},
		{"empty protocol is TCP", corev1.ContainerPort{HostPort: 8080, Protocol: corev1.ProtocolTCP}, corev1.ContainerPort{HostPort: 8080}, true},
		{"in use on one IP, wanted on all", corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.1"}, tcp(8080), true},
		{"in use on all, wanted on one IP", tcp(8080), corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.1"}, true},
		{"0.0.0.0 is all", corev1.ContainerPort{HostPort: 8080, HostIP: "0.0.0.0"}, corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.1"}, true},
		{"two other IPs", corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.1"}, corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.2"}, false},
		{"same IP", corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.1"}, corev1.ContainerPort{HostPort: 8080, HostIP: "10.0.0.1"}, true},
		{"container port only", corev1.ContainerPort{ContainerPort: 8080}, tcp(8080), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			used := portUse{}
			used.add(podHostPorts(withPorts(fitPodSpec("a", "n", nil), tc.used)), 1)
			got := portsConflict(used, podHostPorts(withPorts(fitPodSpec("b", "", nil), tc.want)), nil)
			if got != tc.conflict {
				t.Errorf("%+v in use, %+v wanted: conflict %v, want %v", tc.used, tc.want, got, tc.conflict)
			}
		})
	}
}

// A pod on the host's network takes its container ports on the node; an
// init container holds its ports only as a sidecar (restartPolicy
// Always), as kube-scheduler counts them.
func TestPodHostPorts(t *testing.T) {
	p := withPorts(fitPodSpec("p", "", nil), corev1.ContainerPort{ContainerPort: 29500})
	if got := podHostPorts(p); len(got) != 0 {
		t.Errorf("container port off the host network: %v, want none", got)
	}
	p.Spec.HostNetwork = true
	if got := podHostPorts(p); len(got) != 1 || got[0] != (hostPort{ip: bindAll, protocol: corev1.ProtocolTCP, port: 29500}) {
		t.Errorf("host network: %v, want TCP 29500 on all addresses", got)
	}
	p.Spec.HostNetwork = false
	p.Spec.InitContainers = []corev1.Container{
		{Name: "init", Ports: []corev1.ContainerPort{tcp(1000)}},
		{Name: "sidecar", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Ports: []corev1.ContainerPort{tcp(2000)}},
	}
	if got := podHostPorts(p); len(got) != 1 || got[0].port != 2000 {
		t.Errorf("init containers: %v, want the sidecar's 2000 only", got)
	}
}

// A node where a counted pod (bound, or decided by the controller) uses
// the pod's host port is turned down with kube-scheduler's reason; the
// pod itself, counted on the node, does not conflict with itself, and a
// port is free again once its pod is gone.
func TestFitTrackerHostPorts(t *testing.T) {
	f := NewFitTracker()
	node := fitNode("n", controllertest.ResourceList("cpu", "8", "pods", "10"))
	noLabels := func(string) map[string]string { return nil }
	reason := func(p *corev1.Pod) string { return f.check(p, noLabels).reject(node, nil) }
	f.Observe(withPorts(fitPodSpec("web", "n", nil), tcp(8080)))

	if r := reason(withPorts(fitPodSpec("x", "", nil), tcp(8080))); r != fitPortsConflict {
		t.Errorf("hostPort 8080 on a node whose bound pod uses it: %q, want %q", r, fitPortsConflict)
	}
	if r := reason(withPorts(fitPodSpec("x", "", nil), tcp(8081))); r != "" {
		t.Errorf("hostPort 8081: %q, want it to fit", r)
	}
	if r := reason(fitPodSpec("x", "", nil)); r != "" {
		t.Errorf("a pod without host ports: %q, want it to fit", r)
	}
	nccl := withPorts(fitPodSpec("nccl", "", nil), corev1.ContainerPort{ContainerPort: 8080})
	nccl.Spec.HostNetwork = true
	if r := reason(nccl); r != fitPortsConflict {
		t.Errorf("host-network pod with container port 8080: %q, want %q", r, fitPortsConflict)
	}

	// A decided pod counts before it is bound; it does not conflict with
	// itself when checked again.
	decided := withPorts(fitPodSpec("decided", "", nil), tcp(9000))
	f.Assume(decided, "n")
	if r := reason(decided); r != "" {
		t.Errorf("the decided pod checked again on its node: %q, want it to fit", r)
	}
	if r := reason(withPorts(fitPodSpec("y", "", nil), tcp(9000))); r != fitPortsConflict {
		t.Errorf("hostPort 9000 held by a decided pod: %q, want %q", r, fitPortsConflict)
	}
	f.Unassume(decided.UID)
	f.Forget("web")
	if r := reason(withPorts(fitPodSpec("x", "", nil), tcp(8080), tcp(9000))); r != "" {
		t.Errorf("ports of pods gone: %q, want them free", r)
	}
}

// Copies of a pod with a host port: one per node, none where the port is
// taken; copies of a pod without one are counted by resources as before.
func TestFitCopiesHostPorts(t *testing.T) {
	f := NewFitTracker()
	node := fitNode("n", controllertest.ResourceList("cpu", "8", "pods", "10"))
	other := fitNode("m", controllertest.ResourceList("cpu", "8", "pods", "10"))
	f.Observe(withPorts(fitPodSpec("web", "m", nil), tcp(8080)))
	noLabels := func(string) map[string]string { return nil }

	worker := withPorts(fitPodSpec("w", "", controllertest.ResourceList("cpu", "1")), tcp(8080))
	fc := f.check(worker, noLabels)
	if got := fc.copies(node, 4, nil); got != 1 {
		t.Errorf("copies of a hostPort pod on a free node: %d, want 1", got)
	}
	if got := fc.copies(other, 4, nil); got != 0 {
		t.Errorf("copies of a hostPort pod where the port is taken: %d, want 0", got)
	}
	plain := f.check(fitPodSpec("p", "", controllertest.ResourceList("cpu", "1")), noLabels)
	if got := plain.copies(other, 4, nil); got != 4 {
		t.Errorf("copies of a pod without host ports: %d, want 4", got)
	}
}
