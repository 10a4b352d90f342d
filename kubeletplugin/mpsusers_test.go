package kubeletplugin

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// usingPod is a pod whose container (and, with initUser, init container)
// uses the claim directly, running as the given users (nil: not set).
func usingPod(name, claim string, user, initUser *int64) *corev1.Pod {
	c := func(n string, u *int64) corev1.Container {
		ctr := corev1.Container{Name: n, Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}
		if u != nil {
			ctr.SecurityContext = &corev1.SecurityContext{RunAsUser: u}
		}
		return ctr
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
			Containers:     []corev1.Container{c("main", user), {Name: "sidecar-without-gpu", SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](4242)}}},
		},
	}
	if initUser != nil {
		p.Spec.InitContainers = []corev1.Container{c("init", initUser)}
	}
	return p
}

func reserve(claim *resourceapi.ResourceClaim, pods ...*corev1.Pod) {
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
}

func TestPrepareRefusesMPSClaimOfSeveralUsers(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	e.pods = map[string]*corev1.Pod{}
	d := e.start()
	add := func(p *corev1.Pod) *corev1.Pod { e.pods["default/"+p.Name] = p; return p }

	mixed := newClaim("mixed", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "1Gi", 10)})
	reserve(mixed, add(usingPod("a", "mixed", ptr.To[int64](1000), nil)), add(usingPod("b", "mixed", ptr.To[int64](0), nil)))
	r := prepare(t, d, mixed)[mixed.UID]
	if r.Err == nil {
		t.Fatal("prepared an MPS claim whose containers run as users 0 and 1000")
	}
	for _, want := range []string{"user 0 (b/main)", "user 1000 (a/main)", "runAsUser"} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q lacks %q", r.Err, want)
		}
	}
	if e.specExists(mixed.UID) || len(e.daemon.starts) != 0 {
		t.Error("CDI spec or MPS daemon left behind")
	}

	// An init container counts too; containers without the claim do not.
	initMixed := newClaim("init-mixed", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "1Gi", 10)})
	reserve(initMixed, add(usingPod("c", "init-mixed", ptr.To[int64](1000), ptr.To[int64](2000))))
	if r := prepare(t, d, initMixed)[initMixed.UID]; r.Err == nil || !strings.Contains(r.Err.Error(), "c/init") {
		t.Errorf("init container of another user: error %v", r.Err)
	}

	same := newClaim("same", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 2, "1Gi", 10)})
	reserve(same, add(usingPod("d", "same", ptr.To[int64](1000), nil)), add(usingPod("e", "same", ptr.To[int64](1000), nil)), add(usingPod("f", "same", nil, nil)))
	mustPrepare(t, d, same)

	// Whole GPUs have no MPS server to wait for: any users.
	whole := newClaim("whole", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)})
	reserve(whole, add(usingPod("g", "whole", ptr.To[int64](1), nil)), add(usingPod("h", "whole", ptr.To[int64](2), nil)))
	mustPrepare(t, d, whole)
}
