//go:build e2e

package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver/gang"
)

// kueuePodsReadyTimeout is Kueue's waitForPodsReady timeout in the test:
// long enough for gpulink to place an admitted gang and the test to mark
// its pods ready on the API-only nodes, short enough to watch a job that
// gpulink cannot place give its quota back.
const kueuePodsReadyTimeout = 30 * time.Second

// TestKueue runs gpulink under Kueue v0.17 built from its module (make
// kueue), both as processes on the local cluster with their webhooks on the
// live API server, on API-only 4-GPU nodes (two NVLink pairs each) in two
// leaves: Kueue decides which job may start (quota per team in
// nvidia.com/gpu, counting gpulink's DeviceClass through Kueue's DRA
// mapping), the Job controller makes the pods, gpulink places them (one
// gang, link-minimal) and translates device-plugin-style requests.
func TestKueue(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := setupKueue(ctx, t, kueuePodsReadyTimeout)
	t.Logf("cluster, gpulink and Kueue up %.1fs after the start", time.Since(begin).Seconds())
	s.applyKueue(ctx, t, gpuFlavor)

	t.Run("an admitted Indexed Job runs as one gang in one leaf; the next one over quota stays suspended by Kueue", func(t *testing.T) {
		s.gangUnderQuota(ctx, t)
	})
	t.Run("a job gpulink cannot place says so on its pods and gives its quota back", func(t *testing.T) {
		s.unplaceableReleasesQuota(ctx, t)
	})
	t.Run("device-plugin-style pods count against nvidia.com/gpu quota after gpulink translates them", func(t *testing.T) {
		s.devicePluginQuota(ctx, t)
	})
	t.Run("plain pods under Kueue: both webhooks on one pod, the translated claim counted, no GPUs while Kueue holds the pod", func(t *testing.T) {
		s.plainPodsQuota(ctx, t)
	})
	t.Run("docs/kueue.md's examples are accepted", func(t *testing.T) {
		s.docsExamplesAccepted(ctx, t)
	})
	t.Logf("Kueue e2e took %.1fs", time.Since(begin).Seconds())
}

// gangUnderQuota: team-a's quota is 8 GPUs. An Indexed Job of 4 pods × 2
// GPUs (a ResourceClaimTemplate of gpulink's class, the gang labels in the
// pod template, Required in one leaf) is admitted by Kueue; gpulink places
// its 4 pods together under one leaf, each on an NVLink pair. A second
// such Job is over quota: Kueue keeps it suspended, it has no pods.
func (s *kueueSuite) gangUnderQuota(ctx context.Context, t *testing.T) {
	const team = "team-a"
	s.namespace(ctx, t, team)
	s.applyKueue(ctx, t, teamQueues(team, 8))
	s.template(ctx, t, team, "two-gpus", 2)

	first := kueueJob{namespace: team, name: "train-a", queue: team, pods: 4, template: "two-gpus", gangLevel: "leaf"}.create(ctx, t, s)
	wl := s.waitWorkload(ctx, t, first, "admitted", time.Minute, is("Admitted", "True"))
	t.Logf("Kueue admitted %s: %s", first.Name, conditions(wl)["Admitted"].Message)
	pods := s.waitBoundPods(ctx, t, team, first.Name, 4)
	leaves := map[string]bool{}
	nodes := map[string]int{}
	for _, p := range pods {
		node, err := s.client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		leaves[node.Labels[gang.LabelLeaf]] = true
		nodes[p.Spec.NodeName]++
	}
	if len(leaves) != 1 {
		t.Errorf("gang %s spans leaves %v (nodes %v), want one", first.Name, leaves, nodes)
	}
	s.checkPairs(ctx, t, pods)
	ev := s.waitPodEvent(ctx, t, team, pods[0].Name, "GangPlaced")
	t.Logf("gang %s on nodes %v in leaf %v: %s", first.Name, nodes, leaves, ev)
	s.markReady(ctx, t, pods)
	s.waitWorkload(ctx, t, first, "PodsReady", time.Minute, is("PodsReady", "True"))

	second := kueueJob{namespace: team, name: "train-b", queue: team, pods: 4, template: "two-gpus", gangLevel: "leaf"}.create(ctx, t, s)
	s.checkSuspendedByKueue(ctx, t, second)
	s.checkClusterQueueGPUs(ctx, t, team, 8, 1, "")
}

// unplaceableReleasesQuota: team-b's quota is 16 GPUs. A Job of 4 pods × 4
// GPUs Required in one leaf fits the quota but no leaf (l1 has 2 nodes,
// l2 3): Kueue admits it, gpulink keeps its pods gated with the reason on
// each pod, and after waitForPodsReady's timeout Kueue evicts it, which
// gives its 16 GPUs of quota back: a Job of 8 GPUs that waited behind it
// is admitted and placed.
func (s *kueueSuite) unplaceableReleasesQuota(ctx context.Context, t *testing.T) {
	const team = "team-b"
	s.namespace(ctx, t, team)
	s.applyKueue(ctx, t, teamQueues(team, 16))
	s.template(ctx, t, team, "four-gpus", 4)
	s.template(ctx, t, team, "two-gpus", 2)

	big := kueueJob{namespace: team, name: "big", queue: team, pods: 4, template: "four-gpus", gangLevel: "leaf"}.create(ctx, t, s)
	s.waitWorkload(ctx, t, big, "admitted", time.Minute, is("Admitted", "True"))
	admitted := time.Now()
	var pods []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods = s.jobPods(ctx, t, team, big.Name)
		return len(pods) == 4, nil
	}); err != nil {
		t.Fatalf("admitted Job %s has %d pods, want 4", big.Name, len(pods))
	}
	ev := s.waitPodEvent(ctx, t, team, pods[0].Name, "GangWaiting", "fit in one leaf")
	t.Logf("gpulink on %s: %s", pods[0].Name, ev)
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			t.Errorf("pod %s of the unplaceable gang bound to %s", p.Name, p.Spec.NodeName)
		}
	}

	next := kueueJob{namespace: team, name: "next", queue: team, pods: 4, template: "two-gpus", gangLevel: "leaf"}.create(ctx, t, s)
	s.checkSuspendedByKueue(ctx, t, next)

	wl := s.waitWorkload(ctx, t, big, "evicted for PodsReady timeout", kueuePodsReadyTimeout+2*time.Minute, func(c map[string]kueueCondition) bool {
		return c["Evicted"].Status == "True" || c["Requeued"].Reason == "PodsReadyTimeout"
	})
	c := conditions(wl)
	t.Logf("Kueue evicted %s %.1fs after admitting it: Evicted %s %q; QuotaReserved %s",
		big.Name, time.Since(admitted).Seconds(), c["Evicted"].Reason, c["Evicted"].Message, c["QuotaReserved"].Status)
	if !strings.Contains(c["Evicted"].Reason+c["Requeued"].Reason, "PodsReadyTimeout") {
		t.Errorf("Workload of %s evicted for %q / requeued for %q, want PodsReadyTimeout", big.Name, c["Evicted"].Reason, c["Requeued"].Reason)
	}

	// Its quota goes to the Job that waited; its pods are gone.
	s.waitWorkload(ctx, t, next, "admitted after the eviction", 2*time.Minute, is("Admitted", "True"))
	placed := s.waitBoundPods(ctx, t, team, next.Name, 4)
	s.markReady(ctx, t, placed)
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return len(s.jobPods(ctx, t, team, big.Name)) == 0, nil
	}); err != nil {
		t.Errorf("evicted Job %s still has pods", big.Name)
	}
	got, err := s.client.BatchV1().Jobs(team).Get(ctx, big.Name, metav1.GetOptions{})
	if err != nil || got.Spec.Suspend == nil || !*got.Spec.Suspend {
		t.Errorf("evicted Job %s is not suspended (%v)", big.Name, err)
	}
	s.checkClusterQueueGPUs(ctx, t, team, 8, 1, " (the evicted Job's 16 released)")
}

// devicePluginQuota: team-c's quota is 4 nvidia.com/gpu. A Job of 2 pods
// asking nvidia.com/gpu: 2 in its container limits (written for the device
// plugin) is counted by Kueue from the Job's pod template (4 GPUs) and
// admitted; the Job controller's pods then go through gpulink's
// translating webhook (Kueue's webhook acts on the Job, gpulink's on its
// pods: both on the live API server) and get 2 GPUs each through claims. A
// second such Job is over quota and stays suspended.
func (s *kueueSuite) devicePluginQuota(ctx context.Context, t *testing.T) {
	const team = "team-c"
	s.namespace(ctx, t, team)
	s.applyKueue(ctx, t, teamQueues(team, 4))

	first := kueueJob{namespace: team, name: "dp-a", queue: team, pods: 2, gpus: 2}.create(ctx, t, s)
	wl := s.waitWorkload(ctx, t, first, "admitted", time.Minute, is("Admitted", "True"))
	var status struct {
		Admission struct {
			PodSetAssignments []struct {
				ResourceUsage map[string]string `json:"resourceUsage"`
			} `json:"podSetAssignments"`
		} `json:"admission"`
	}
	if err := fromUnstructured(wl, "status", &status); err != nil {
		t.Fatal(err)
	}
	if a := status.Admission.PodSetAssignments; len(a) != 1 || a[0].ResourceUsage["nvidia.com/gpu"] != "4" {
		t.Errorf("Workload of %s admitted with %+v, want nvidia.com/gpu 4", first.Name, a)
	}
	pods := s.waitBoundPods(ctx, t, team, first.Name, 2)
	for _, p := range pods {
		if p.Labels[compat.LabelManaged] != "true" {
			t.Errorf("pod %s has labels %v, want %s=true from gpulink's webhook", p.Name, p.Labels, compat.LabelManaged)
		}
		if q, ok := p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; ok {
			t.Errorf("translated pod %s still asks nvidia.com/gpu: %s", p.Name, q.String())
		}
	}
	s.checkPairs(ctx, t, pods)
	s.markReady(ctx, t, pods)
	s.waitWorkload(ctx, t, first, "PodsReady", time.Minute, is("PodsReady", "True"))

	second := kueueJob{namespace: team, name: "dp-b", queue: team, pods: 2, gpus: 2}.create(ctx, t, s)
	s.checkSuspendedByKueue(ctx, t, second)
	s.checkClusterQueueGPUs(ctx, t, team, 4, 1, "")
}
