package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

var explainNow = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// runExplain runs `gpulink explain args...` against objs in a fake clientset.
func runExplain(t *testing.T, objs []runtime.Object, args ...string) (string, error) {
	t.Helper()
	cs := fake.NewClientset(objs...)
	root := NewRootCommand("gpulink")
	for _, c := range root.Commands() {
		if c.Name() == "explain" {
			root.RemoveCommand(c)
		}
	}
	cmd := newExplainCommandWith("gpulink", func(*inspectOptions) (kubernetes.Interface, string, error) { return cs, fakeServer, nil },
		func(*inspectOptions) string { return "team-a" })
	root.AddCommand(cmd)
	var out bytes.Buffer
	root.SetArgs(append([]string{"explain"}, args...))
	root.SetOut(&out)
	root.SetErr(&out)
	explainClock = func() time.Time { return explainNow }
	t.Cleanup(func() { explainClock = time.Now })
	err := root.Execute()
	return out.String(), err
}

func podWithClaim(name, claim string, gated bool, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID(name)},
		Spec: corev1.PodSpec{
			NodeName:       node,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(claim)}},
		},
	}
	if gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
	}
	if node != "" {
		p.Status.Phase = corev1.PodRunning
	} else {
		p.Status.Phase = corev1.PodPending
	}
	return p
}

func podEvent(pod, reason, from, msg string, ago time.Duration) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: "team-a", Name: pod + "." + reason},
		InvolvedObject:      corev1.ObjectReference{Kind: "Pod", Namespace: "team-a", Name: pod, UID: types.UID(pod)},
		Reason:              reason,
		Message:             msg,
		Type:                corev1.EventTypeNormal,
		ReportingController: from,
		EventTime:           metav1.NewMicroTime(explainNow.Add(-ago)),
	}
}

func TestExplainAllocatedPod(t *testing.T) {
	claim := heldClaim("team-a", "train-gpus", nil, wholeGPU("node-a", "gpu-1"), wholeGPU("node-a", "gpu-3"))
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "trainer"}}
	out, err := runExplain(t, []runtime.Object{
		publishedSlice(t, "node-a", "pcie-nvbridge-8.txt", "Tesla T4", 16<<30),
		claim,
		podWithClaim("trainer", "train-gpus", false, "node-a"),
		podEvent("trainer", "GPUsAllocated", "gpulink-controller",
			"allocated gpus=gpu-1,gpu-3: every pair PXB on node-a; also fit: node-b (2 GPUs weakest link SYS)", 5*time.Minute),
		podEvent("trainer", "Scheduled", "default-scheduler", "Successfully assigned team-a/trainer to node-a", 4*time.Minute),
		podEvent("other", "GPUsAllocated", "gpulink-controller", "someone else's", time.Minute),
	}, "trainer")
	if err != nil {
		t.Fatalf("explain failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Pod team-a/trainer: GPUs allocated, running on node node-a (phase Running)\n",
		"  gpus (ResourceClaim train-gpus): allocated on node node-a, reserved for this pod\n",
		"    request gpus: gpu-1, gpu-3 (whole GPUs): weakest link PXB, below the node's best for 2 GPUs (NV4)",
		"NODE node-a: 8 GPUs, 6 free, 0 shared, 2 held whole\n",
		"  GPUs: 8 x Tesla T4\n",
		"Decision (gpulink controller):\n  GPUsAllocated 5m: allocated gpus=gpu-1,gpu-3: every pair PXB on node-a; also fit: node-b (2 GPUs weakest link SYS)\n",
		"Events (latest 2, oldest first):",
		"Scheduled",
		"default-scheduler",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "someone else's") {
		t.Errorf("output shows another pod's event:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n > 24 {
		t.Errorf("explanation takes %d lines, more than one screen:\n%s", n, out)
	}
}

func TestExplainBestSet(t *testing.T) {
	claim := heldClaim("team-a", "pair", []string{"trainer"}, wholeGPU("node-a", "gpu-0"), wholeGPU("node-a", "gpu-1"))
	out, err := runExplain(t, []runtime.Object{
		publishedSlice(t, "node-a", "pcie-nvbridge-8.txt", "Tesla T4", 16<<30), claim,
		podWithClaim("trainer", "pair", false, "node-a"),
	}, "trainer")
	if err != nil {
		t.Fatal(err)
	}
	if want := "request gpus: gpu-0, gpu-1 (whole GPUs): weakest link NV4, the best any 2 GPUs of this node have"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if !strings.Contains(out, "none recorded") {
		t.Errorf("output does not say that no decision was recorded:\n%s", out)
	}
}

func TestExplainWaitingPod(t *testing.T) {
	out, err := runExplain(t, []runtime.Object{
		heldClaim("team-a", "eight", nil),
		podWithClaim("big", "eight", true, ""),
		podEvent("big", "WaitingForGPUs", "gpulink-controller",
			"waiting: no node has 8 GPUs (node-a: only 6 free GPUs)", 10*time.Second),
	}, "-n", "team-a", "big")
	if err != nil {
		t.Fatalf("explain failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Pod team-a/big: waiting for GPUs, held back by the scheduling gate " + driver.SchedulingGate + "\n",
		"  gpus (ResourceClaim eight): not allocated\n",
		"  WaitingForGPUs 10s: waiting: no node has 8 GPUs (node-a: only 6 free GPUs)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestExplainTemplateClaimNotCreated(t *testing.T) {
	pod := podWithClaim("p", "x", true, "")
	pod.Spec.ResourceClaims[0] = corev1.PodResourceClaim{Name: "gpus", ResourceClaimTemplateName: ptr.To("tmpl")}
	out, err := runExplain(t, []runtime.Object{pod}, "p")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "  gpus: not created yet (") {
		t.Errorf("output does not say the claim is not created yet:\n%s", out)
	}
}

func TestExplainErrors(t *testing.T) {
	if _, err := runExplain(t, nil, "ghost"); err == nil || !strings.Contains(err.Error(), "pod team-a/ghost not found at "+fakeServer) {
		t.Errorf("missing pod: err = %v", err)
	}
	if _, err := runExplain(t, nil); err == nil || !isUsageError(err) {
		t.Errorf("no pod named: err = %v, want a usage error", err)
	}
	if _, err := runExplain(t, nil, "--events=-1", "x"); err == nil || !strings.Contains(err.Error(), "--events must not be negative, got -1") {
		t.Errorf("negative --events: err = %v", err)
	}
}
