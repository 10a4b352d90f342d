//go:build integration

package scale_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/steer"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/tracebench"
)

// The replay of FGD's trace through the real controller (issue 32, part
// 3; `make replay-controller`): a reduced openb cluster as API-only nodes
// (every REPLAY_STRIDE-th node of the trace's node list, with its CPU,
// memory, GPU model and the topology the replay gives it), one seed of a
// task list, each task created in the replay's order through the API
// server and placed before the next arrives: GPU tasks as a pod with one
// claim, gated, allocated by gpulink-controller with the chart's defaults
// (--rank-by-stranding, --steer-cpu-pods=taint, --steer-scarce-nodes),
// then bound by kube-scheduler; tasks without GPUs as a plain pod, placed
// by kube-scheduler alone on nodes the controller's steering taints mark, as
// a cluster with the chart's defaults places them. A task nothing can hold is deleted (the
// replay drops it). At each 10 % step of GPU requests arrived, the GPU
// allocated is read from the cluster's claims and compared with `gpulink
// simulate --trace` (tracebench.Replay) for the same nodes, seed and
// policy (gpulink:fresh: the chart's defaults on a controller that starts
// with an empty cluster).

// replayConfig is the run's size (GPULINK_REPLAY_* variables).
type replayConfig struct {
	Trace      string
	List       string
	Stride     int
	Seed       uint64
	MaxPercent int
	// Tolerance is the largest difference allowed at a step, in points
	// of the cluster's GPU capacity.
	Tolerance float64
	Report    string
	// CPUPods says who places the tasks without GPUs (GPULINK_REPLAY_CPU_PODS):
	// "simulator" (the default) binds each to the node the simulator's
	// model of kube-scheduler chose, so that both sides start every GPU
	// decision from the same cluster and must agree exactly;
	// "kube-scheduler" leaves them to the cluster's kube-scheduler, whose
	// ties among equal nodes (and whose sampling of 100 of the 152 nodes)
	// are its own, so the two drift apart by its randomness.
	CPUPods string
}

func replayConfigFromEnv(t *testing.T) replayConfig {
	t.Helper()
	c := replayConfig{Trace: "../../../shared/traces/openb", List: "default", Stride: 8, Seed: 1, MaxPercent: 130, Tolerance: 0.5,
		Report: os.Getenv("GPULINK_REPLAY_REPORT"), CPUPods: "simulator"}
	if v := os.Getenv("GPULINK_REPLAY_CPU_PODS"); v != "" {
		if v != "simulator" && v != "kube-scheduler" {
			t.Fatalf("GPULINK_REPLAY_CPU_PODS=%q: want simulator or kube-scheduler", v)
		}
		c.CPUPods = v
	}
	if v := os.Getenv("GPULINK_REPLAY_TRACE"); v != "" {
		c.Trace = v
	}
	if v := os.Getenv("GPULINK_REPLAY_LIST"); v != "" {
		c.List = v
	}
	for env, p := range map[string]*int{"GPULINK_REPLAY_STRIDE": &c.Stride, "GPULINK_REPLAY_MAX_PERCENT": &c.MaxPercent} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive integer", env, v)
			}
			*p = n
		}
	}
	if v := os.Getenv("GPULINK_REPLAY_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n < 1 {
			t.Fatalf("GPULINK_REPLAY_SEED=%q: want a positive integer", v)
		}
		c.Seed = n
	}
	return c
}

// replayStep is one 10 % step: the simulator's and the cluster's GPU left
// unallocated, in % of capacity, and the tasks each failed to place.
type replayStep struct {
	Percent                                  int
	SimulatorIdle, ClusterIdle               float64
	SimulatorFailedTasks, ClusterFailedTasks int
}

func TestReplayController(t *testing.T) {
	if os.Getenv("GPULINK_REPLAY") == "" {
		t.Skip("set GPULINK_REPLAY=1 (make replay-controller): creates every task of a trace replay through the API server")
	}
	cfg := replayConfigFromEnv(t)
	if _, err := os.Stat(cfg.Trace); err != nil {
		t.Skipf("no trace at %s (GPULINK_REPLAY_TRACE): %v", cfg.Trace, err)
	}
	tr, err := tracebench.Load(cfg.Trace, cfg.List)
	if err != nil {
		t.Fatal(err)
	}
	opt := tracebench.Options{TopologyDir: "../../driver/topology/testdata", NodeStride: cfg.Stride, MaxPercent: cfg.MaxPercent,
		Seeds: []uint64{cfg.Seed}, Policies: []string{tracebench.PolicyGpulinkFresh}, RecordPlacements: true}
	plan, err := tracebench.NewReplayPlan(tr, opt, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := tracebench.Replay(tr, opt)
	if err != nil {
		t.Fatal(err)
	}
	simSteps := sim.Runs[0].Steps
	t.Logf("replay: %s seed %d, %d nodes (every %d), %d GPUs, %d tasks up to %d %%", cfg.List, cfg.Seed, len(plan.Nodes), cfg.Stride,
		plan.CapacityMilli/tracebench.MilliPerGPU, len(plan.Tasks), cfg.MaxPercent)

	e := setup(t)
	ctrl := startControllerProcess(t, e, false)
	defer ctrl.stop()
	ctrl.waitReady(t)
	// Node names keep the trace's order (the controller and the replay
	// break ties by node name).
	names := make([]string, len(plan.Nodes))
	for i, n := range plan.Nodes {
		names[i] = e.ns + "-" + n.Name
	}
	parallel(t, 16, len(plan.Nodes), func(i int) error {
		n := plan.Nodes[i]
		node := controllertest.Node(names[i])
		for _, l := range []corev1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
			l[corev1.ResourceCPU] = *resource.NewMilliQuantity(n.CPUMilli, resource.DecimalSI)
			l[corev1.ResourceMemory] = *resource.NewQuantity(n.MemoryMiB<<20, resource.BinarySI)
		}
		return publishNodeObject(e.ctx, e.client, node, n.Topology)
	})
	t.Cleanup(func() {
		parallel(t, 16, len(names), func(i int) error {
			_ = e.client.ResourceV1().ResourceSlices().Delete(e.ctx, names[i]+"-"+driver.Name, metav1.DeleteOptions{})
			_ = e.client.CoreV1().Nodes().Delete(e.ctx, names[i], metav1.DeleteOptions{})
			return nil
		})
	})
	time.Sleep(5 * time.Second)

	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	var steps []replayStep
	var diverged []string
	var arrived int64
	failed, next := 0, 10
	start := time.Now()
	for i := range plan.Tasks {
		task := &plan.Tasks[i]
		arrived += task.TotalMilli()
		var node string
		switch want := sim.Runs[0].Placements[i]; {
		case task.GPUs > 0 || cfg.CPUPods == "kube-scheduler":
			node = replayTask(t, e, ctrl, i, task, "")
		case want >= 0:
			node = replayTask(t, e, ctrl, i, task, names[want])
		}
		got := -1
		if node != "" {
			got = index[node]
		} else {
			failed++
		}
		// The first tasks placed elsewhere than in the simulator say
		// where a difference comes from.
		if want := sim.Runs[0].Placements[i]; got != want && len(diverged) < 10 {
			diverged = append(diverged, fmt.Sprintf("task %d (%+v): cluster node %d, simulator node %d (-1: not placed)", i, *task, got, want))
		}
		for next <= cfg.MaxPercent && arrived*100 >= plan.CapacityMilli*int64(next) {
			idle := 100 * float64(plan.CapacityMilli-clusterAllocatedMilli(t, e)) / float64(plan.CapacityMilli)
			s := simSteps[next/10-1]
			steps = append(steps, replayStep{Percent: next, ClusterIdle: idle, ClusterFailedTasks: failed,
				SimulatorIdle: 100 * float64(s.Idle) / float64(plan.CapacityMilli), SimulatorFailedTasks: s.FailedTasks})
			t.Logf("%d %% arrived (%d tasks, %s): unallocated GPU %.2f %% in the cluster, %.2f %% in the simulator; tasks not placed %d and %d",
				next, i+1, time.Since(start).Round(time.Second), idle, steps[len(steps)-1].SimulatorIdle, failed, s.FailedTasks)
			next += 10
		}
	}
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
	var table strings.Builder
	table.WriteString("| arrived | simulator: unallocated GPU | cluster | difference (points) | tasks not placed: simulator | cluster |\n|---|---|---|---|---|---|\n")
	for _, s := range steps {
		d := s.ClusterIdle - s.SimulatorIdle
		fmt.Fprintf(&table, "| %d %% | %.2f %% | %.2f %% | %+.2f | %d | %d |\n", s.Percent, s.SimulatorIdle, s.ClusterIdle, d, s.SimulatorFailedTasks, s.ClusterFailedTasks)
		if math.Abs(d) > cfg.Tolerance {
			t.Errorf("%d %% arrived: the cluster leaves %.2f %% of the GPUs unallocated, the simulator %.2f %%: %.2f points apart, more than %.2f",
				s.Percent, s.ClusterIdle, s.SimulatorIdle, math.Abs(d), cfg.Tolerance)
		}
	}
	t.Logf("replay through the controller against the simulator (%s, seed %d, every %d-th node):\n%s", cfg.List, cfg.Seed, cfg.Stride, table.String())
	// What the steering taint cost (--steer-cpu-pods=taint): node patches.
	m := ctrl.scrape(t)
	gpuTasks := 0
	for i := range plan.Tasks {
		if plan.Tasks[i].GPUs > 0 {
			gpuTasks++
		}
	}
	for _, taint := range steer.Taints {
		t.Logf("steering taint %s: %.0f node patches adding it, %.0f removing it, for %d nodes and %d GPU tasks", taint.Key,
			m[fmt.Sprintf(`gpulink_controller_steer_taint_writes_total{action="add",taint=%q}`, taint.Key)],
			m[fmt.Sprintf(`gpulink_controller_steer_taint_writes_total{action="remove",taint=%q}`, taint.Key)], len(plan.Nodes), gpuTasks)
	}
	if len(diverged) > 0 {
		t.Logf("first tasks placed differently:\n%s", strings.Join(diverged, "\n"))
	}
	if cfg.Report != "" {
		out, err := json.MarshalIndent(map[string]any{"Config": cfg, "Nodes": len(plan.Nodes), "Tasks": len(plan.Tasks), "Steps": steps}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.Report, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// replayTask creates task i (bound to bindTo when set) and waits until it
// is bound to a node (its name) or nothing can hold it ("": it is deleted,
// as the replay drops it):
// for a GPU pod, the controller's decision to wait; for a pod without
// GPUs, kube-scheduler's Unschedulable condition.
func replayTask(t *testing.T, e *env, ctrl *controllerProcess, i int, task *tracebench.Task, bindTo string) string {
	t.Helper()
	name := fmt.Sprintf("t%05d", i)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU:    *resource.NewMilliQuantity(task.CPUMilli, resource.DecimalSI),
					corev1.ResourceMemory: *resource.NewQuantity(task.MemoryMiB<<20, resource.BinarySI)}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			// A task without GPUs bound by the test (replayConfig.CPUPods).
			NodeName: bindTo,
		},
	}
	waiting := 0.0
	if task.GPUs > 0 {
		req := controllertest.WholeRequest("gpu", int64(task.GPUs))
		if task.Share() {
			req = controllertest.ShareRequest("gpu", strconv.FormatInt(tracebench.ShareMemory(task.GPUMilli), 10), strconv.FormatInt(tracebench.ShareCores(task.GPUMilli), 10))
		}
		if len(task.Models) > 0 {
			req.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].productName in ["%s"]`, driver.Name, strings.Join(task.Models, `", "`))}}}
		}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}}
		if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
		pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
		waiting = ctrl.scrape(t)[`gpulink_controller_decisions_total{outcome="waiting"}`]
	}
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	placed := ""
	e.poll("task "+name+" placed or refused", 2*time.Minute, func() bool {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if p.Spec.NodeName != "" {
			placed = p.Spec.NodeName
			return true
		}
		if task.GPUs > 0 {
			return gated(p) && ctrl.scrape(t)[`gpulink_controller_decisions_total{outcome="waiting"}`] > waiting
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})
	if placed == "" {
		if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		if task.GPUs > 0 {
			if err := e.client.ResourceV1().ResourceClaims(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return placed
}

// clusterAllocatedMilli is the GPU the namespace's claims hold, in milli
// GPU: 1000 for a device given whole, the share's memory over the replay's
// nominal GPU memory for a share.
func clusterAllocatedMilli(t *testing.T, e *env) int64 {
	t.Helper()
	claims, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var milli int64
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if mem, ok := r.ConsumedCapacity[driver.CapacityMemory]; ok {
				milli += mem.Value() * tracebench.MilliPerGPU / tracebench.NominalGPUMemory
			} else {
				milli += tracebench.MilliPerGPU
			}
		}
	}
	return milli
}
