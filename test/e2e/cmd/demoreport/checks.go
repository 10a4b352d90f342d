package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

// processesAlive returns an error naming the first gpulink process of the
// run directory that is no longer running, with the tail of its log.
func processesAlive(runDir string) error {
	if runDir == "" {
		return nil
	}
	pidFiles, err := filepath.Glob(filepath.Join(runDir, "*.pid"))
	if err != nil {
		return err
	}
	for _, f := range pidFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if syscall.Kill(pid, 0) != nil {
			log := strings.TrimSuffix(f, ".pid") + ".log"
			return fmt.Errorf("%s (pid %d) is not running; last lines of %s:\n%s", filepath.Base(strings.TrimSuffix(f, ".pid")), pid, log, localcluster.TailFile(log, 20))
		}
	}
	return nil
}

// driverRoot lays out the stand-in driver install the real node's kubelet
// plugin reads (nvcdi finds the driver's files; containers get the
// /dev/nvidia* stand-ins through CDI), the layout the e2e tests use.
func driverRoot(o options) error {
	if o.driverRoot == "" || o.gpus <= 0 {
		return fmt.Errorf("driver-root needs -dir and -gpus > 0, got -dir %q -gpus %d", o.driverRoot, o.gpus)
	}
	if _, err := localcluster.WriteFakeDriverFiles(o.driverRoot); err != nil {
		return fmt.Errorf("driver files under %s: %w", o.driverRoot, err)
	}
	if err := localcluster.MakeDeviceNodes(o.driverRoot, o.gpus); err != nil {
		if !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("device nodes under %s: %w", o.driverRoot, err)
		}
		progress("mknod not permitted (%v): containers get the GPU environment but no /dev/nvidia* stand-ins", err)
	}
	return nil
}

// waitGate waits until the API server applies the chart's scheduling-gate
// policy, which it picks up asynchronously: a server-side dry run of a pod
// with a claim is repeated until it comes back with gpulink's gate. The
// pod is in namespace default, which exists before the demo's own.
func waitGate(ctx context.Context, client kubernetes.Interface, o options) error {
	template := "gate-probe"
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gate-probe", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &template}},
			Containers: []corev1.Container{{Name: "probe", Image: localcluster.WorkloadImage,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
		},
	}
	var gates []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil // the policy's API objects may not be served yet
		}
		gates = gates[:0]
		for _, g := range p.Spec.SchedulingGates {
			gates = append(gates, g.Name)
		}
		return slices.Equal(gates, []string{driver.SchedulingGate}), nil
	})
	if err != nil {
		return fmt.Errorf("the scheduling-gate policy did not take effect within %s (a dry-run pod got gates %q, want %q): %w", o.timeout, gates, driver.SchedulingGate, err)
	}
	progress("the scheduling-gate policy is in effect")
	return nil
}

func waitSlices(ctx context.Context, client kubernetes.Interface, o options) error {
	if o.node == "" || o.devices <= 0 {
		return errors.New("wait-slices needs -node and -devices")
	}
	start := time.Now()
	have := 0
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
		if err := processesAlive(o.runDir); err != nil {
			return false, err
		}
		nodes, err := gpuview.Nodes(ctx, client)
		if err != nil {
			return false, nil // a pool may be half-published
		}
		have = 0
		if n := nodes[o.node]; n != nil {
			have = len(n.GPUs)
		}
		return have == o.devices, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: %d of %d GPUs published: %w", o.node, have, o.devices, err)
	}
	progress("%s: %d GPUs published as ResourceSlices (%.1fs)", o.node, o.devices, time.Since(start).Seconds())
	return nil
}

// podClaims returns the pod's claims, nil while one is not created yet.
func podClaims(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		name := pc.ResourceClaimName
		if name == nil {
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name {
					name = st.ResourceClaimName
				}
			}
		}
		if name == nil {
			return nil, nil
		}
		c, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func waitPods(ctx context.Context, client kubernetes.Interface, o options) error {
	if len(o.pods) == 0 {
		return errors.New("wait needs -pods")
	}
	for _, name := range o.pods {
		start := time.Now()
		state := "not created"
		var pod *corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
			if err := processesAlive(o.runDir); err != nil {
				return false, err
			}
			var err error
			pod, err = client.CoreV1().Pods(o.namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			claims, err := podClaims(ctx, client, pod)
			if err != nil {
				return false, err
			}
			if claims == nil {
				state = "waiting for its ResourceClaim"
				return false, nil
			}
			for _, c := range claims {
				if c.Status.Allocation == nil {
					state = "claim " + c.Name + " not allocated"
					return false, nil
				}
			}
			switch {
			case slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == driver.SchedulingGate }):
				state = "allocated, scheduling gate not removed yet"
			case pod.Spec.NodeName == "":
				state = "allocated and ungated, not bound yet"
			case pod.Spec.NodeName == o.realNode && !podReady(pod):
				state = "bound to " + pod.Spec.NodeName + ", not running yet"
			default:
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("pod %s/%s: %s after %.0fs: %w%s", o.namespace, name, state, time.Since(start).Seconds(), err, podEvents(context.Background(), client, o.namespace, name))
		}
		what := "running"
		if pod.Spec.NodeName != o.realNode {
			what = "bound (API-only node: nothing runs there)"
		}
		progress("pod %s: allocated, ungated, %s on %s (%.1fs)", name, what, pod.Spec.NodeName, time.Since(start).Seconds())
	}
	return nil
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podEvents(ctx context.Context, client kubernetes.Interface, ns, name string) string {
	events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil || len(events.Items) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nevents:")
	for _, e := range events.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}
