package mps

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

const testGPUUUID = "GPU-8f6e1a2b-0c3d-4e5f-8a9b-0c1d2e3f4a5b"

// groupShare is claim's Concurrent share of namespace group on GPU 1.
func groupShare(claim, group string, memGiB, cores int64) Share {
	return Share{Claim: types.UID(claim), Group: group,
		GPUs: []Device{{GPU: GPU{Index: 1, UUID: testGPUUUID}, MemoryBytes: memGiB * gib}}, Cores: cores}
}

// runPods plays the kubelet: every daemon pod that appears in the plugin's
// namespace runs, and the control daemon answers, until the test ends.
func runPods(t *testing.T, cs *fake.Clientset, ctl *fakeControl) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list, err := cs.CoreV1().Pods("gpulink").List(ctx, metav1.ListOptions{})
			if err == nil {
				for i := range list.Items {
					p := &list.Items[i]
					if p.Status.Phase != "" {
						continue
					}
					p.Status.Phase = corev1.PodRunning
					if _, err := cs.CoreV1().Pods("gpulink").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err == nil {
						ctl.mu.Lock()
						ctl.up = true
						ctl.mu.Unlock()
					}
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
}

// The daemon of a sharing group on a GPU: named after the group and the
// GPU's UUID (unique among every node's daemon pods in the plugin's
// namespace), labelled with the group instead of a claim, serving the one
// GPU, and started without daemon-wide limits, which would bind every
// claim of the group to the first one's.
func TestGroupDaemonPod(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}})
	ctl := &fakeControl{}
	d, _ := newTestPodDaemon(t, cs, ctl)
	d.cfg.StartTimeout = time.Minute
	root := t.TempDir()
	m := NewManager(root, d)
	a := groupShare("aaaaaaaa-0000-0000-0000-000000000001", "team-a", 4, 30)
	const wantID = "team-a-gpu-8f6e1a2b-0c3d-4e5f-8a9b-0c1d2e3f4a5b"
	if a.ID() != wantID || !a.Concurrent() {
		t.Fatalf("ID %q concurrent %v, want %q", a.ID(), a.Concurrent(), wantID)
	}
	dirs := m.Dirs(a)
	if dirs.Base != root+"/"+wantID {
		t.Errorf("dirs %+v", dirs)
	}
	runPods(t, cs, ctl)
	if err := m.EnsureDaemon(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), "gpulink-mps-"+wantID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pod.Labels[mpsClaimLabel]; ok || pod.Labels[mpsGroupLabel] != "team-a" || pod.Labels[mpsNodeLabel] != "n1" {
		t.Errorf("labels %v, want the group and the node, no claim", pod.Labels)
	}
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["CUDA_VISIBLE_DEVICES"] != testGPUUUID || env["CUDA_MPS_PIPE_DIRECTORY"] != dirs.Pipe || env["CUDA_MPS_LOG_DIRECTORY"] != dirs.Log {
		t.Errorf("daemon env %v", env)
	}
	if len(c.Resources.Limits) != 1 || c.Resources.Limits.Name(DaemonResourceName(1), "").Value() != 1 {
		t.Errorf("resources %v, want one slot of GPU 1's", c.Resources.Limits)
	}
	if want := []string{"get_server_list"}; !slices.Equal(ctl.commands, want) {
		t.Errorf("control commands %q, want %q: a group's daemon has no limits of its own", ctl.commands, want)
	}
	// Nothing to set again either.
	ctl.commands = nil
	if failed, err := m.ReassertLimits(t.Context()); err != nil || len(failed) != 0 || len(ctl.commands) != 0 {
		t.Errorf("ReassertLimits: %v %v, commands %q", failed, err, ctl.commands)
	}
	if err := d.ReassertLimits(t.Context(), a, dirs); err != nil || len(ctl.commands) != 0 {
		t.Errorf("PodDaemon.ReassertLimits: %v, commands %q", err, ctl.commands)
	}
	listed, err := d.ListDaemons(t.Context())
	if err != nil || !slices.Equal(listed, []string{wantID}) {
		t.Errorf("ListDaemons %v %v, want [%s]", listed, err, wantID)
	}
	if err := m.ReleaseDaemon(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), "gpulink-mps-"+wantID, metav1.GetOptions{}); err == nil {
		t.Error("group daemon pod not deleted with its last share")
	}
}

// Without a UUID the name would not be unique among the nodes: refused,
// and nothing is created.
func TestGroupDaemonNeedsUUID(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	d, _ := newTestPodDaemon(t, cs, &fakeControl{up: true})
	m := NewManager(t.TempDir(), d)
	s := groupShare("c", "team-a", 1, 10)
	s.GPUs[0].UUID = ""
	if s.ID() != "team-a-gpu-1" {
		t.Errorf("ID without a UUID %q", s.ID())
	}
	err := m.EnsureDaemon(t.Context(), s)
	if err == nil || !strings.Contains(err.Error(), "known UUID") {
		t.Fatalf("error %v", err)
	}
	if list, _ := cs.CoreV1().Pods("gpulink").List(t.Context(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("pods created: %v", list.Items)
	}
	if _, err := os.Stat(m.Dirs(s).Base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dirs created: %v", err)
	}
}

// A restarted plugin takes the references of every claim of the group
// again (recovery calls EnsureDaemon per checkpointed reference): the
// running pod is adopted, not created twice, the orphan cleanup keeps it,
// and it stops only with the group's last claim. An orphaned group daemon
// of this node (no claim kept it) is removed; another node's is not seen.
func TestGroupDaemonRestart(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	ctl := &fakeControl{}
	d, _ := newTestPodDaemon(t, cs, ctl)
	d.cfg.StartTimeout = time.Minute
	root := t.TempDir()
	runPods(t, cs, ctl)
	a := groupShare("aaaaaaaa-0000-0000-0000-000000000001", "team-a", 4, 30)
	b := groupShare("bbbbbbbb-0000-0000-0000-000000000002", "team-a", 2, 20)
	m := NewManager(root, d)
	for _, s := range []Share{a, b} {
		if err := m.EnsureDaemon(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	creates := func() int {
		n := 0
		for _, a := range cs.Actions() {
			if a.GetVerb() == "create" && a.GetResource().Resource == "pods" {
				n++
			}
		}
		return n
	}
	if n := creates(); n != 1 {
		t.Fatalf("%d daemon pods created for two claims of one group on one GPU, want 1", n)
	}
	// Orphans: a group daemon of this node nobody references, and one of
	// another node.
	orphan := groupShare("cccccccc-0000-0000-0000-000000000003", "team-b", 1, 10)
	orphanPod := d.DaemonPod(orphan, m.Dirs(orphan))
	theirs := d.DaemonPod(orphan, m.Dirs(orphan))
	theirs.Name = "gpulink-mps-team-b-gpu-00000000-0000-0000-0000-000000000009"
	theirs.Spec.NodeName, theirs.Labels[mpsNodeLabel] = "n2", "n2"
	for _, p := range []*corev1.Pod{orphanPod, theirs} {
		p.Status.Phase = corev1.PodRunning
		if _, err := cs.CoreV1().Pods("gpulink").Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Restart.
	d2, _ := newTestPodDaemon(t, cs, ctl)
	m2 := NewManager(root, d2)
	for _, s := range []Share{a, b} {
		if err := m2.EnsureDaemon(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	// Adopted: its create met the running pod, which nobody deleted.
	for _, act := range cs.Actions() {
		if act.GetVerb() == "delete" {
			t.Errorf("the restart deleted a pod: %v", act)
		}
	}
	if n := m2.(*mpsManager).Refs(a.ID()); n != 2 {
		t.Errorf("group daemon has %d references after the restart, want 2", n)
	}
	removed, err := m2.RemoveOrphans(t.Context(), map[string]bool{string(a.Claim): true, string(b.Claim): true, a.ID(): true})
	if err != nil || !slices.Equal(removed, []string{orphan.ID()}) {
		t.Errorf("RemoveOrphans removed %v (%v), want only %s", removed, err, orphan.ID())
	}
	for name, want := range map[string]bool{"gpulink-mps-" + a.ID(): true, orphanPod.Name: false, theirs.Name: true} {
		if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), name, metav1.GetOptions{}); (err == nil) != want {
			t.Errorf("pod %s exists %v, want %v", name, err == nil, want)
		}
	}
	if err := m2.ReleaseDaemon(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), "gpulink-mps-"+a.ID(), metav1.GetOptions{}); err != nil {
		t.Fatalf("group daemon stopped while claim b still uses it: %v", err)
	}
	if err := m2.ReleaseDaemon(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), "gpulink-mps-"+a.ID(), metav1.GetOptions{}); err == nil {
		t.Error("group daemon still there after its last claim")
	}
}
