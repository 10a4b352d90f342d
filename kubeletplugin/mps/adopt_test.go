package mps

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// At plugin start a prepared claim's daemon pod is adopted. When the API
// server answers no definite "it exists" (the Node read for the owner
// reference fails, the create gets a 5xx or an admission refusal that
// comes before AlreadyExists), the running daemon pod and its pipe and shm
// directories must survive: running containers use them. The reference
// is kept and RetryKept adopts the daemon once the API answers.
func TestPodMPSDaemonAdoptionNeverDestroysOnTransientErrors(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	type fault struct {
		verb, resource string
		err            error
	}
	createFails := func(err error) fault { return fault{"create", "pods", err} }
	for name, tc := range map[string]struct {
		faults []fault
		// kept: no definite answer at all, so the daemon is kept for
		// RetryKept; otherwise the pod is read and adopted at once.
		kept bool
	}{
		"node read fails":             {faults: []fault{{"get", "nodes", unavailable}}, kept: true},
		"create gets a 5xx":           {faults: []fault{createFails(apierrors.NewInternalError(errors.New("etcdserver: request timed out")))}},
		"create refused by admission": {faults: []fault{createFails(apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "gpulink-mps-c1", errors.New("denied by policy")))}},
		"create times out":            {faults: []fault{createFails(apierrors.NewTimeoutError("request did not complete within 60s", 1))}},
		"create and read fail": {faults: []fault{createFails(apierrors.NewInternalError(errors.New("etcdserver: leader changed"))), {"get", "pods", unavailable}},
			kept: true},
	} {
		t.Run(name, func(t *testing.T) {
			running := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "gpulink-mps-c1", Namespace: "gpulink"},
				Spec:       corev1.PodSpec{NodeName: "n1"},
				Status:     corev1.PodStatus{Phase: corev1.PodRunning},
			}
			cs := fake.NewClientset(running, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid"}})
			var failing atomic.Bool
			failing.Store(true)
			for _, f := range tc.faults {
				cs.PrependReactor(f.verb, f.resource, func(clienttesting.Action) (bool, runtime.Object, error) {
					if failing.Load() {
						return true, nil, f.err
					}
					return false, nil, nil
				})
			}
			ctl := &fakeControl{up: true}
			d, _ := newTestPodDaemon(t, cs, ctl)
			m := NewManager(t.TempDir(), d)
			share := Share{Claim: "c1", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10}
			// The running daemon's pipe, as a client left it.
			dirs := m.Dirs(share)
			if err := dirs.create(); err != nil {
				t.Fatal(err)
			}
			control := filepath.Join(dirs.Pipe, "control")
			if err := os.WriteFile(control, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			podAndPipeSurvive := func(when string) {
				t.Helper()
				if _, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "gpulink", running.Name); err != nil {
					t.Fatalf("%s: the running daemon pod was deleted: %v", when, err)
				}
				if _, err := os.Stat(control); err != nil {
					t.Fatalf("%s: the running daemon's pipe directory was removed: %v", when, err)
				}
			}

			err := m.EnsureDaemon(t.Context(), share)
			podAndPipeSurvive("after the API error")
			if !tc.kept {
				if err != nil {
					t.Fatalf("EnsureDaemon: %v, want the running pod read and adopted", err)
				}
			} else {
				if err == nil || !errors.Is(err, ErrDaemonKept) {
					t.Fatalf("EnsureDaemon: %v, want an error marked ErrDaemonKept", err)
				}
				if failed, err := m.RetryKept(t.Context()); err == nil || len(failed) != 1 {
					t.Errorf("RetryKept while the API still fails: %v %v, want c1 still kept", failed, err)
				}
				podAndPipeSurvive("after a retry")
				// The API answers again: the retry adopts the daemon.
				failing.Store(false)
				if failed, err := m.RetryKept(t.Context()); err != nil || len(failed) != 0 {
					t.Fatalf("RetryKept: %v %v", failed, err)
				}
			}
			ctl.mu.Lock()
			cmds := strings.Join(ctl.commands, ";")
			ctl.mu.Unlock()
			if !strings.Contains(cmds, "set_default_active_thread_percentage 10") {
				t.Errorf("limits not set on the adopted daemon: %s", cmds)
			}
			if failed, err := m.RetryKept(t.Context()); err != nil || len(failed) != 0 {
				t.Errorf("RetryKept after adoption: %v %v, want nothing left", failed, err)
			}
			// One reference, released by the claim's unprepare.
			failing.Store(false)
			if err := m.ReleaseDaemon(t.Context(), share); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CoreV1().Pods("gpulink").Get(t.Context(), running.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("daemon pod after the last release: %v", err)
			}
		})
	}
}

// A definite answer still cleans up: a create refused while no pod exists
// leaves neither a pod nor directories behind.
func TestPodMPSDaemonCreateRefusedWithoutPodCleansUp(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	cs.PrependReactor("create", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "gpulink-mps-c1", errors.New("denied by policy"))
	})
	d, _ := newTestPodDaemon(t, cs, &fakeControl{up: true})
	m := NewManager(t.TempDir(), d)
	share := Share{Claim: "c1", GPUs: []Device{{GPU: GPU{UUID: "GPU-0"}, MemoryBytes: gib}}, Cores: 10}
	err := m.EnsureDaemon(t.Context(), share)
	if err == nil || errors.Is(err, ErrDaemonKept) || !strings.Contains(err.Error(), "denied by policy") {
		t.Fatalf("EnsureDaemon: %v, want the refusal, not kept", err)
	}
	if _, err := os.Stat(m.Dirs(share).Base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directories left behind: %v", err)
	}
	if err := m.ReleaseDaemon(t.Context(), share); err == nil {
		t.Error("a reference was kept")
	}
}
