package mps

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestPodMPSDaemonUnprivileged: the daemon pod asks for one slot of each
// of its claim's GPUs' MPS daemon resources, and nothing else, and runs
// without privilege or privilege escalation, as root with only CAP_SETUID
// and CAP_SETGID (to start each client's server as the client's user);
// the device plugin gives it the device nodes.
func TestPodMPSDaemonUnprivileged(t *testing.T) {
	d, _ := newTestPodDaemon(t, fake.NewClientset(), &fakeControl{})
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "pair", Cores: 50, GPUs: []Device{
		{GPU: GPU{Index: 3, UUID: "GPU-3"}, MemoryBytes: gib},
		{GPU: GPU{Index: 1, UUID: "GPU-1"}, MemoryBytes: gib},
	}}
	pod := d.DaemonPod(share, m.Dirs(share))
	c := pod.Spec.Containers[0]
	want := corev1.ResourceRequirements{Limits: corev1.ResourceList{
		"mps-daemon.gpu.gpulink.dev/gpu-3": resource.MustParse("1"),
		"mps-daemon.gpu.gpulink.dev/gpu-1": resource.MustParse("1"),
	}}
	if !reflect.DeepEqual(c.Resources, want) {
		t.Errorf("daemon resources %+v, want %+v", c.Resources, want)
	}
	wantSC := &corev1.SecurityContext{
		RunAsUser:                ptr.To[int64](0),
		RunAsGroup:               ptr.To[int64](0),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}},
	}
	if !reflect.DeepEqual(c.SecurityContext, wantSC) {
		t.Errorf("daemon security context %+v, want %+v", c.SecurityContext, wantSC)
	}
	if pod.Spec.SecurityContext != nil || pod.Spec.HostPID || pod.Spec.HostIPC || pod.Spec.HostNetwork {
		t.Errorf("daemon pod spec %+v: want no pod security context or host namespaces", pod.Spec)
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && (v.HostPath.Path == "/dev" || v.HostPath.Path == "/") {
			t.Errorf("daemon pod mounts the host's %s", v.HostPath.Path)
		}
	}
}
