//go:build e2e

package conformance_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/test/localcluster"
)

// run is one case on the cluster: the peer files it applied and what its
// pods saw.
type run struct {
	e   *env
	c   *peerCase
	dir string
	// ns is the namespace for documents that name none.
	ns         string
	namespaces map[string]bool
	refused    []refusal
	// clusterObjects are deleted at cleanup.
	clusterObjects []clusterObject
}

// seen is what one pod's containers printed.
type seen struct {
	pod  *corev1.Pod
	logs map[string]string // container name → workload output
}

// waitRunning waits until n pods run in namespace ns (or, with
// exitAfterPrint, completed) and every container printed READY.
func (r *run) waitRunning(ctx context.Context, t *testing.T, ns string, n int) []seen {
	t.Helper()
	return r.waitPods(ctx, t, ns, n, func(string) bool { return true })
}

// waitPod is waitRunning for the one pod name of ns.
func (r *run) waitPod(ctx context.Context, t *testing.T, ns, name string) seen {
	t.Helper()
	return r.waitPods(ctx, t, ns, 1, func(n string) bool { return n == name })[0]
}

// waitPods is waitRunning for the pods whose names match.
func (r *run) waitPods(ctx context.Context, t *testing.T, ns string, n int, match func(string) bool) []seen {
	t.Helper()
	var out []seen
	var state string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := r.e.alive(); err != nil {
			return false, err
		}
		pods, err := r.e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		out = out[:0]
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil || !match(p.Name) {
				continue
			}
			if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodSucceeded {
				state = fmt.Sprintf("pod %s: phase %s, gates %v", p.Name, p.Status.Phase, p.Spec.SchedulingGates)
				return false, nil
			}
			s := seen{pod: p, logs: map[string]string{}}
			for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
				log, err := r.containerLog(ctx, p, ctr.Name)
				if err != nil || !strings.Contains(log, "\nREADY") {
					state = fmt.Sprintf("pod %s container %s: not READY (%v)", p.Name, ctr.Name, err)
					return false, nil
				}
				s.logs[ctr.Name] = log
			}
			out = append(out, s)
		}
		state = fmt.Sprintf("%d of %d pods READY", len(out), n)
		return len(out) == n, nil
	})
	if err != nil {
		t.Fatalf("%s: namespace %s: %s: %v\n%s", r.c.files[0], ns, state, err, r.describe(ctx, ns))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pod.Name < out[j].pod.Name })
	for _, s := range out {
		for ctr, log := range s.logs {
			t.Logf("pod %s/%s container %s sees GPUs %v %s", ns, s.pod.Name, ctr, gpus(log), mpsEnv(log))
		}
	}
	return out
}

// containerLog reads a container's output through the API server or,
// failing that, from the kubelet's log file.
func (r *run) containerLog(ctx context.Context, p *corev1.Pod, ctr string) (string, error) {
	raw, err := r.e.client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr}).DoRaw(ctx)
	if err == nil {
		return string(raw), nil
	}
	log, ferr := localcluster.ReadPodLogFile(r.e.cluster.PodLogDir(), p, ctr)
	if ferr != nil {
		return "", fmt.Errorf("API: %v; %w", err, ferr)
	}
	return log, nil
}

// waitWaiting checks that a pod stays unscheduled, its claims unallocated,
// and that gpulink explains why with its WaitingForGPUs event; it returns
// the event's message.
func (r *run) waitWaiting(ctx context.Context, t *testing.T, ns, name string) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := r.e.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, ev := range events.Items {
			if ev.Reason == report.ReasonWaiting {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: pod %s/%s: no %s event: %v\n%s", r.c.files[0], ns, name, report.ReasonWaiting, err, r.describe(ctx, ns))
	}
	pod, err := r.e.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != "" || pod.Status.Phase != corev1.PodPending {
		t.Errorf("%s: pod %s/%s is %s on %q, want Pending and unbound", r.c.files[0], ns, name, pod.Status.Phase, pod.Spec.NodeName)
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			continue
		}
		claim, err := r.e.client.ResourceV1().ResourceClaims(ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err == nil && claim.Status.Allocation != nil {
			t.Errorf("%s: claim %s/%s of waiting pod %s is allocated", r.c.files[0], ns, claim.Name, name)
		}
	}
	t.Logf("pod %s/%s waits: %s", ns, name, msg)
	return msg
}

// event waits for an event of the given reason on the named object of ns
// and returns its message.
func (r *run) event(ctx context.Context, t *testing.T, ns, name, reason string) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := r.e.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, ev := range events.Items {
			if ev.Reason == reason {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: %s/%s: no %s event: %v\n%s", r.c.files[0], ns, name, reason, err, r.describe(ctx, ns))
	}
	return msg
}

// claims returns the namespace's claims by name.
func (r *run) claims(ctx context.Context, t *testing.T, ns string) map[string]*resourceapi.ResourceClaim {
	t.Helper()
	list, err := r.e.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*resourceapi.ResourceClaim{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// describe summarizes a namespace's pods and events for failure messages.
func (r *run) describe(ctx context.Context, ns string) string {
	var b strings.Builder
	pods, err := r.e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s: phase %s, node %q, gates %v\n", ns, p.Name, p.Status.Phase, p.Spec.NodeName, p.Spec.SchedulingGates)
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil {
				fmt.Fprintf(&b, "  container %s waiting: %s %s\n", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			}
		}
	}
	events, err := r.e.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "  event %s %s/%s %s: %s\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

// envValue returns an environment variable of the workload's output.
func envValue(log, name string) (string, bool) {
	for _, l := range strings.Split(log, "\n") {
		if kv, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "ENV "); ok {
			if k, v, ok := strings.Cut(kv, "="); ok && k == name {
				return v, true
			}
		}
	}
	return "", false
}

// gpus is what a container sees: the GPU UUIDs of NVIDIA_VISIBLE_DEVICES
// (gpulink's CDI spec sets it to exactly the claim's GPUs), sorted.
func gpus(log string) []string {
	v, ok := envValue(log, "NVIDIA_VISIBLE_DEVICES")
	if !ok || v == "" || v == "void" {
		return nil
	}
	out := strings.Split(v, ",")
	sort.Strings(out)
	return out
}

// mpsEnv is the MPS limits a container got, for the log.
func mpsEnv(log string) string {
	var parts []string
	for _, k := range []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"} {
		if v, ok := envValue(log, k); ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, " ")
}
